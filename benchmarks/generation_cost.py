"""An emulated generation engine: the real completions are generated, then the call is held until
`tokens x (a + b x rows)` seconds have passed since it began (`tokens`: the call's decode steps, its longest
completion; `rows`: its completions). Puts a CPU run in the generation-bound regime of a GPU engine
(`benchmarks/partner_and_regime.md`, part B). Everything it affects is an emulation and is reported as one."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GenerationCost:
    """Seconds a call holds: `a` per decode step (latency) plus `b` per decode step and row (throughput)."""

    a: float
    b: float

    def __post_init__(self):
        if not (self.a >= 0 and self.b >= 0 and self.a + self.b > 0):
            raise ValueError(f"a and b must be >= 0 and not both 0, got a={self.a!r}, b={self.b!r}")

    def seconds(self, tokens: int, rows: int) -> float:
        """The held seconds of a call of `rows` completions and `tokens` decode steps."""
        return tokens * (self.a + self.b * rows)

    def growth(self, rows: int) -> float:
        """s: a call of `rows` rows over one of `rows / 2` (the same decode steps)."""
        return self.seconds(1, rows) / self.seconds(1, rows / 2)

    @classmethod
    def calibrated(cls, full_seconds: float, tokens: int, rows: int, growth: float) -> GenerationCost:
        """The cost whose call of `rows` rows and `tokens` decode steps holds `full_seconds`, and holds `growth` times
        a call of `rows / 2` rows: from `a + rows b = s (a + rows b / 2)`, `a = b (rows / 2) (2 - s) / (s - 1)`."""
        if not 1.0 < growth <= 2.0:
            raise ValueError(f"growth (s) must be in (1, 2], got {growth!r}")
        if not (full_seconds > 0 and tokens > 0 and rows > 0):
            raise ValueError("full_seconds, tokens and rows must be positive")
        half = rows / 2
        a_per_b = half * (2.0 - growth) / (growth - 1.0)
        b = full_seconds / (tokens * (a_per_b + rows))
        return cls(a=a_per_b * b, b=b)


@dataclass
class HeldCalls:
    """What the hold did: per call (tokens, rows, real seconds, held seconds); `overruns`: calls whose real
    generation already took longer than their hold (not held further)."""

    calls: list[tuple[int, int, float, float]] = field(default_factory=list)
    overruns: int = 0

    def summary(self) -> dict:
        n = len(self.calls)
        return {
            "calls": n,
            "overruns": self.overruns,
            "real_seconds": sum(c[2] for c in self.calls),
            "held_seconds": sum(c[3] for c in self.calls),
            "median_tokens": sorted(c[0] for c in self.calls)[n // 2] if n else None,
        }


def held_generate(
    generate: Callable,
    cost: GenerationCost,
    record: HeldCalls,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> Callable:
    """`generate` (TRL's `GRPOTrainer._generate`: its result's second item is the completions' token ids), held to
    `cost`: after the real call, sleep until `cost.seconds(tokens, rows)` have passed since it began."""

    def held(prompts):
        began = clock()
        output = generate(prompts)
        completion_ids = output[1]
        tokens = max((len(ids) for ids in completion_ids), default=0)
        rows = len(completion_ids)
        target = cost.seconds(tokens, rows)
        real = clock() - began
        if real < target:
            sleep(target - real)
        else:
            record.overruns += 1
        record.calls.append((tokens, rows, real, max(target, real)))
        return output

    return held
