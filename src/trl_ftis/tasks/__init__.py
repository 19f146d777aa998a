"""Verifiable tasks and their rewards: the addition task of the tiny models ([`.addition`]), GSM8K-format word
problems for small chat models ([`.word_problems`]) and the paper's GSM8K / MATH-500 ([`.math_problems`]).
Their evaluations share one generation loop ([`.generation`]). This package never imports [`trl_ftis.demo`].

The core (`trl_ftis.objective`, `config`, `trainer`, `peer_rows`, `swarm`, `exchange`) never imports this package.
"""
