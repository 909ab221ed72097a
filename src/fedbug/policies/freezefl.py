"""FreezeFL's adaptive layer freezing, the client half (Algorithm 1, lines 12-21; Eq. 2-3).

Each round a client trains one epoch with every unit (the probe), measures how far each unit
moved (Eq. 2), and chooses how many units n* to freeze from the input side (Eq. 3):

    P_l = ||w^l - w^{k,l}||_1 / dim(w^l)                                    (Eq. 2)
    n* = argmax_{n in 0..L-1} (sum_{l>n} P_l) * (T_r / tau_n)^(beta * [T_r < tau_n])   (Eq. 3)

with dim the unit's parameter count (buffers such as BatchNorm statistics are not weights and
are left out), ties to the smaller n, T_r the round's soft deadline and tau_n the time the client
would be charged with the first n units frozen. ``importance: sqrt_l1`` takes the square root of
P_l, as the authors' code does. Then:

* ``probe: rollback`` (the paper): units 1..n* go back to the received weights and the
  remaining E-1 epochs train units n*+1..L, optimiser state kept;
* ``probe: restart`` (the authors' code): the round starts over from the received weights and
  all E epochs train units n*+1..L; the probe is not kept.

The server gives each client its T_r and tau_0..tau_{L-1} in ``task.extra`` (``"deadline"``,
``"tau"``); the policy reads nothing else. The decision lives in a dict keyed by
(round, client) on the policy, shared by the clients a worker trains one after another; the
entries of other tasks are dropped when a task starts (step 1). ``T0`` and ``deadline_ema`` are
the server's (the soft deadline T_{r+1} = (1 - a) T_r + a mean(t_k)); they live here so that the
config's ``freezefl:`` block is one place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from fedbug.policies.base import POLICIES, StepCtx

if TYPE_CHECKING:  # client.py imports the policies package: no import cycle at run time
    from fedbug.client import ClientTask, EpochAction, EpochCtx
    from fedbug.units import ParamSpace


class FreezeFLParams(BaseModel):
    """The config's ``freezefl:`` block."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    beta: float = Field(
        4.0, ge=0.0, allow_inf_nan=False, description="Eq. 3's beta (0: never freeze)"
    )
    importance: Literal["l1", "sqrt_l1"] = Field(
        "l1", description="l1: Eq. 2 (paper); sqrt_l1: its square root (authors' code)"
    )
    probe: Literal["rollback", "restart"] = Field(
        "rollback",
        description="rollback: keep the probe epoch, frozen units back to received (paper); "
        "restart: start over with n* frozen, probe not charged (authors' code)",
    )
    T0: float = Field(1.0, gt=0.0, allow_inf_nan=False, description="initial soft deadline")
    deadline_ema: float = Field(
        0.4, ge=0.0, le=1.0, description="T <- (1 - a) T + a mean(t_k) (Eq. 1)"
    )


def importance(local: Tensor, received: Tensor, space: ParamSpace, mode: str = "l1") -> list[float]:
    """P_l of Eq. 2 for every unit of ``space``: the mean absolute change of the unit's
    parameters (buffers left out); ``sqrt_l1`` returns sqrt(P_l). A unit without parameters
    scores 0."""
    if mode not in ("l1", "sqrt_l1"):
        raise ValueError(f"importance mode must be 'l1' or 'sqrt_l1'; got {mode!r}")
    diff = (local.detach() - received.detach()).abs().to(torch.float64)
    sums = [0.0] * space.num_units
    for is_param, off, n, u in zip(space.is_param, space.offsets, space.numels, space.unit_of):
        if is_param:
            sums[u] += float(diff[off : off + n].sum())
    out = []
    for s, dim in zip(sums, space.unit_param_numel):
        p = s / dim if dim else 0.0
        out.append(math.sqrt(p) if mode == "sqrt_l1" else p)
    return out


def choose_frozen(
    importance: Sequence[float], deadline: float, tau: Sequence[float], beta: float
) -> int:
    """n* of Eq. 3: argmax over n in 0..L-1 of (sum of P_l over the units n+1..L that stay
    trainable) * (T_r / tau_n)^(beta [T_r < tau_n]); ties go to the smaller n."""
    num = len(importance)
    if num == 0:
        raise ValueError("choose_frozen needs at least one unit")
    if len(tau) != num:
        raise ValueError(f"tau has {len(tau)} entries for {num} units; need one per n = 0..L-1")
    if not (math.isfinite(deadline) and deadline > 0):
        raise ValueError(f"the soft deadline must be positive and finite; got {deadline}")
    if any(not (math.isfinite(t) and t > 0) for t in tau):
        raise ValueError(f"every tau_n must be positive and finite; got {list(tau)}")
    if not beta >= 0:
        raise ValueError(f"beta must be >= 0; got {beta}")
    # suffix sums from the output side, so that a unit of zero importance gives an exact tie
    suffix = [0.0] * (num + 1)
    for l in range(num - 1, -1, -1):
        suffix[l] = float(importance[l]) + suffix[l + 1]
    best, best_score = 0, -math.inf
    for n in range(num):
        factor = (deadline / tau[n]) ** beta if deadline < tau[n] else 1.0
        score = suffix[n] * factor
        if score > best_score:
            best, best_score = n, score
    return best


@dataclass
class _Decision:
    """One (round, client)'s probe and choice."""

    num_units: int
    decided: bool = False
    n_frozen: int = 0
    importance: list[float] = field(default_factory=list)
    awaiting_restart: bool = False


@POLICIES.register("freezefl")
class FreezeFL:
    """All units train during the probe epoch; then units n*..L-1 (0-based) for that client."""

    def __init__(self, params: FreezeFLParams | None = None) -> None:
        self.params = params if params is not None else FreezeFLParams()
        self.decisions: dict[tuple[int, int], _Decision] = {}

    @classmethod
    def from_options(
        cls, freezefl: FreezeFLParams | dict[str, Any] | None = None, **_: Any
    ) -> FreezeFL:
        if isinstance(freezefl, dict):
            freezefl = FreezeFLParams(**freezefl)
        return cls(freezefl)

    def __repr__(self) -> str:
        return f"FreezeFL({self.params!r})"

    # -- the client hooks ----------------------------------------------------------------
    def trainable_units(self, ctx: StepCtx) -> range:
        key = (ctx.round, ctx.client)
        entry = self.decisions.get(key)
        if ctx.step == 1:
            for other in [k for k in self.decisions if k != key]:
                del self.decisions[other]
            if entry is not None and entry.awaiting_restart:
                entry.awaiting_restart = False  # the round starts over with n* frozen
            else:
                entry = self.decisions[key] = _Decision(ctx.num_units)
        if entry is None or not entry.decided:
            return range(ctx.num_units)
        return range(min(entry.n_frozen, ctx.num_units - 1), ctx.num_units)

    def end_of_epoch(self, ctx: EpochCtx) -> EpochAction | None:
        from fedbug.client import EpochAction

        if ctx.epoch != 1:
            return None
        task = ctx.task
        key = (task.round, task.client)
        entry = self.decisions.get(key)
        if entry is None:
            entry = self.decisions[key] = _Decision(ctx.space.num_units)
        if entry.decided:  # restart mode: epoch 1 of the second pass
            return None
        deadline, tau = _round_config(task, entry.num_units)
        scores = importance(ctx.local, ctx.received, ctx.space, self.params.importance)
        scores = scores[: entry.num_units]  # units an algorithm adds are not the policy's
        n = choose_frozen(scores, deadline, tau, self.params.beta)
        entry.decided, entry.n_frozen, entry.importance = True, n, scores
        if n == 0:
            return None
        if self.params.probe == "restart":
            entry.awaiting_restart = True
            return EpochAction(restart=True)
        return EpochAction(restore=tuple(range(n)))

    def client_metrics(self, task: ClientTask) -> dict[str, Any]:
        entry = self.decisions.get((task.round, task.client))
        n = entry.n_frozen if entry is not None and entry.decided else 0
        tau = task.extra.get("tau")
        return {
            "n_frozen": n,
            "importance": list(entry.importance) if entry is not None else [],
            "charged_time": float(tau[n]) if tau is not None and len(tau) > n else None,
        }


def _round_config(task: ClientTask, num_units: int) -> tuple[float, list[float]]:
    """T_r and tau_0..tau_{L-1} from the task's per-client round config."""
    missing = [k for k in ("deadline", "tau") if k not in task.extra]
    if missing:
        raise ValueError(
            f"policy freezefl needs task.extra[{missing[0]!r}] (the soft deadline T_r and the "
            f"charged times tau_0..tau_{{L-1}}) from the engine; round {task.round}, "
            f"client {task.client} has keys {sorted(task.extra)}"
        )
    tau = [float(t) for t in task.extra["tau"]]
    if len(tau) != num_units:
        raise ValueError(
            f"task.extra['tau'] has {len(tau)} entries; freezefl needs one per n = 0..L-1, "
            f"L = {num_units} units"
        )
    return float(task.extra["deadline"]), tau
