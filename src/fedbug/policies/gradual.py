"""Gradual unfreezing over the first P of the K local steps, bottom-up (FedBug) or top-down.

FedBug, Algorithm 3 (appendix C): at local step k = 1..K the first m = min(M, ceil(k*M/(P*K)))
of the M units train; the whole received model is frozen before step 1, one unit thaws every
P*K/M steps, and after the GU stage all units train. P = 0 is vanilla training (a warning says
so). Top-down (the ablation of Sec. 5.2, ULMFiT-style) thaws the same number of units from the
output down. Options: ``bottom_up: {gu_ratio: P}`` (or ``top_down:``), P = 0.4 by default (the
paper's headline setting).

``gu_period: floor`` is the FedBug authors' code (``utils_gu.py``, ``StopGradScheduler``): a GU
period of floor(P*K/M) whole steps, so unit j (0-based) thaws at 0-based step j*floor(P*K/M) and
m = min(M, 1 + floor((k-1) / floor(P*K/M))); the default ``exact`` is the paper's period P*K/M.
The two agree when P*K/M is a whole number (the authors' CIFAR settings); otherwise ``floor``
thaws every unit earlier (K = 20, P = 0.4, M = 5: all five by step 5, the paper's by step 7).
Where floor(P*K/M) = 0 (fewer GU steps than units) the authors' code stops (an assert, or a
division by zero); ``floor`` then trains every unit from the first step (unit j thaws at step
j*0), where ``exact`` thaws several units a step. Top-down counts its units the same way.
"""

from __future__ import annotations

import warnings
from math import ceil
from typing import Literal

from pydantic import Field

from fedbug.errors import ConfigError
from fedbug.policies.base import POLICIES, FreezePolicy, PolicyParams, StepCtx


class GradualParams(PolicyParams):
    """The ``bottom_up:`` / ``top_down:`` block."""

    # defaults by keyword: mypy's dataclass_transform reading of pydantic sees only
    # ``default=`` (a positional default leaves the field required to it)
    gu_ratio: float = Field(
        default=0.4, ge=0.0, le=1.0, description="P, the share of local steps spent unfreezing"
    )
    gu_period: Literal["exact", "floor"] = Field(
        default="exact",
        description="a unit thaws every P*K/M steps (exact, the paper) or every floor(P*K/M) "
        "steps (floor, the authors' code)",
    )


def unfrozen_count(
    step: int, local_steps: int, num_units: int, gu_ratio: float, gu_period: str = "exact"
) -> int:
    """m = min(M, ceil(k*M/(P*K))) of Algorithm 3 (``exact``), or with the authors' floored
    period F = floor(P*K/M), m = min(M, 1 + floor((k-1)/F)) (``floor``); M when P = 0."""
    if gu_ratio == 0:
        return num_units
    if gu_period == "floor":
        # in floats, as utils_gu.py: factor = gu_ratio * totel_iters // M; unit j stays frozen
        # while local_iter_count // factor <= j - 1 (local_iter_count = k - 1)
        period = gu_ratio * local_steps // num_units
        if period <= 0:  # where the code stops: every unit j thaws at step j*0
            return num_units
        return int(min(num_units, 1 + (step - 1) // period))
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
        self._warned_short = False
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
        p = self.params
        m = unfrozen_count(ctx.step, ctx.local_steps, ctx.num_units, p.gu_ratio, p.gu_period)
        if ctx.step == 1 and m == ctx.num_units > 1 and p.gu_ratio > 0:
            self._warn_short_stage(ctx)
        return m

    def _warn_short_stage(self, ctx: StepCtx) -> None:
        """One warning a policy: a GU stage too short to keep any unit frozen (P*K <= 1 step,
        or the floored period 0) leaves a client's training plain."""
        if self._warned_short:
            return
        self._warned_short = True
        warnings.warn(
            f"{self.name}: a GU stage of {self.gu_ratio:g} x {ctx.local_steps} local steps thaws "
            f"all {ctx.num_units} units at the first step, so a client with {ctx.local_steps} "
            f"local step{'s' if ctx.local_steps != 1 else ''} trains as under policy: none; "
            "raise gu_ratio or the local steps",
            stacklevel=2,
        )


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
