"""Gradual unfreezing over the first P of the K local steps, bottom-up (FedBug) or top-down.

FedBug, Algorithm 3 (appendix C): at local step k = 1..K the first m = min(M, ceil(k*M/(P*K)))
of the M units train; the whole received model is frozen before step 1, one unit thaws every
P*K/M steps, and after the GU stage all units train. P = 0 is vanilla training (a warning says
so). Top-down (the ablation of Sec. 5.2, ULMFiT-style) thaws the same number of units from the
output down. Options: ``bottom_up: {gu_ratio: P}`` (or ``top_down:``), P = 0.4 by default (the
paper's headline setting).
"""

from __future__ import annotations

import warnings
from math import ceil

from pydantic import Field

from fedbug.errors import ConfigError
from fedbug.policies.base import POLICIES, FreezePolicy, PolicyParams, StepCtx


class GradualParams(PolicyParams):
    """The ``bottom_up:`` / ``top_down:`` block."""

    gu_ratio: float = Field(
        0.4, ge=0.0, le=1.0, description="P, the share of local steps spent unfreezing"
    )


def unfrozen_count(step: int, local_steps: int, num_units: int, gu_ratio: float) -> int:
    """m = min(M, ceil(k*M/(P*K))) of Algorithm 3; M when P = 0."""
    if gu_ratio == 0:
        return num_units
    # k*M/(P*K) computed as a fraction of integers where P is exact, to avoid ceil(2.0000000001).
    value = step * num_units / (gu_ratio * local_steps)
    m = ceil(value - 1e-9 * value)
    return max(1, min(num_units, m))


class _Gradual(FreezePolicy):
    params_cls = GradualParams
    params: GradualParams

    def __init__(self, params: GradualParams | float | None = None) -> None:
        if isinstance(params, int | float):  # BottomUp(0.4): the ratio alone
            if not 0.0 <= params <= 1.0:
                raise ConfigError(f"gu_ratio must be in [0, 1] (the GU share P); got {params}")
            params = GradualParams(gu_ratio=params)
        super().__init__(params)
        if self.gu_ratio == 0:
            warnings.warn(
                f"{self.name} with gu_ratio 0 unfreezes every unit at the first step: it is "
                "plain training (policy: none)",
                stacklevel=2,
            )

    @property
    def gu_ratio(self) -> float:
        return self.params.gu_ratio

    def count(self, ctx: StepCtx) -> int:
        return unfrozen_count(ctx.step, ctx.local_steps, ctx.num_units, self.gu_ratio)


@POLICIES.register("bottom_up")
class BottomUp(_Gradual):
    """FedBug: units 1..m train (input side first)."""

    name = "bottom_up"

    def trainable_units(self, ctx: StepCtx) -> range:
        return range(self.count(ctx))


@POLICIES.register("top_down")
class TopDown(_Gradual):
    """Ablation: units M-m+1..M train (output side first)."""

    name = "top_down"

    def trainable_units(self, ctx: StepCtx) -> range:
        return range(ctx.num_units - self.count(ctx), ctx.num_units)
