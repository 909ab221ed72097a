"""Gradual unfreezing over the first P of the K local steps, bottom-up (FedBug) or top-down.

FedBug, Algorithm 3 (appendix C): at local step k = 1..K the first m = min(M, ceil(k*M/(P*K)))
of the M units train; the whole received model is frozen before step 1, one unit thaws every
P*K/M steps, and after the GU stage all units train. P = 0 is vanilla training. Top-down (the
ablation of Sec. 5.2, ULMFiT-style) thaws the same number of units from the output down.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from typing import Any

from fedbug.errors import ConfigError
from fedbug.policies.base import POLICIES, StepCtx


def unfrozen_count(step: int, local_steps: int, num_units: int, gu_ratio: float) -> int:
    """m = min(M, ceil(k*M/(P*K))) of Algorithm 3; M when P = 0."""
    if gu_ratio == 0:
        return num_units
    # k*M/(P*K) computed as a fraction of integers where P is exact, to avoid ceil(2.0000000001).
    value = step * num_units / (gu_ratio * local_steps)
    m = ceil(value - 1e-9 * value)
    return max(1, min(num_units, m))


@dataclass(frozen=True)
class _Gradual:
    gu_ratio: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.gu_ratio <= 1.0:
            raise ConfigError(f"gu_ratio must be in [0, 1] (the GU share P); got {self.gu_ratio}")

    @classmethod
    def from_options(cls, gu_ratio: float = 0.0, **_: Any) -> _Gradual:
        return cls(gu_ratio=gu_ratio)

    def count(self, ctx: StepCtx) -> int:
        return unfrozen_count(ctx.step, ctx.local_steps, ctx.num_units, self.gu_ratio)


@POLICIES.register("bottom_up")
@dataclass(frozen=True)
class BottomUp(_Gradual):
    """FedBug: units 1..m train (input side first)."""

    def trainable_units(self, ctx: StepCtx) -> range:
        return range(self.count(ctx))


@POLICIES.register("top_down")
@dataclass(frozen=True)
class TopDown(_Gradual):
    """Ablation: units M-m+1..M train (output side first)."""

    def trainable_units(self, ctx: StepCtx) -> range:
        return range(ctx.num_units - self.count(ctx), ctx.num_units)
