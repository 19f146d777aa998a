"""Verifiable tasks and their rewards: the addition task of the tiny models (:mod:`.addition`), GSM8K-format word
problems for small chat models (:mod:`.word_problems`) and the paper's GSM8K / MATH-500 (:mod:`.math_problems`).
Their evaluations share one generation loop (:mod:`.generation`). This package never imports :mod:`trl_ftis.demo`.

The core (`trl_ftis.objective`, `config`, `trainer`, `peer_rows`, `swarm`, `exchange`) never imports this package.
"""
