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
``"tau"``); the client half reads nothing else, and its decision lives on the client's own
session. The server half keeps the soft deadline T_{r+1} = (1 - a) T_r + a mean(t_k) (``T0``,
``deadline_ema``), so all of FreezeFL's freezing sits in this one class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedbug.policies.base import (
    POLICIES,
    EpochAction,
    EpochCtx,
    FreezePolicy,
    PolicyParams,
    PolicySession,
    StepCtx,
)

if TYPE_CHECKING:
    from fedbug.core.protocol import ClientResult, ClientTask
    from fedbug.core.units import ParamSpace
    from fedbug.system import SystemModel


PROBES: tuple[str, ...] = ("rollback", "restart")


class FreezeFLParams(PolicyParams):
    """The config's ``freezefl:`` block."""

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


@POLICIES.register("freezefl")
class FreezeFL(FreezePolicy):
    """All units train during the probe epoch; then units n*..L-1 (0-based) for that client.

    Server half: the soft deadline (Eq. 1), sent to every client with its charged times
    tau_0..tau_{L-1} from the simulated system; client half: :class:`FreezeFLClient`."""

    name = "freezefl"
    params_cls = FreezeFLParams
    params: FreezeFLParams

    def __init__(self, params: FreezeFLParams | None = None) -> None:
        super().__init__(params)
        self.system: SystemModel | None = None
        self.deadline: SoftDeadline | None = None

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        if cfg.system is None:
            return (
                "policy: freezefl needs a system: block (the simulated devices), e.g. "
                "system: {abilities: uniform}"
            )
        if cfg.upload != "partial":  # its deadline and charge count what a straggler sends
            return (
                "policy: freezefl charges a client for the units it trains and uploads (its "
                "frozen ones stay home, FreezeFL Sec. IV); set upload: partial (aggregation: full "
                "still counts an unsent unit as unchanged)"
            )
        return None

    # -- client half ---------------------------------------------------------------------
    def trainable_units(self, ctx: StepCtx) -> range:
        """Every unit: what a client freezes is its own decision (:class:`FreezeFLClient`)."""
        return range(ctx.num_units)

    def start_client(self, task: ClientTask) -> FreezeFLClient:
        return FreezeFLClient(self, task)

    # -- server half ---------------------------------------------------------------------
    def setup_server(self, system: Any, cfg: Any) -> None:
        self.system = system
        self.deadline = SoftDeadline(self.params.T0, self.params.deadline_ema)

    def client_config(self, client: int) -> dict[str, Any]:
        if self.system is None or self.deadline is None:
            raise ValueError("policy freezefl: setup_server(system, cfg) must come first")
        return {
            "deadline": self.deadline.value,
            "tau": charged_times(self.system, client, self.params.probe),
        }

    def round_deadline(self) -> float | None:
        return self.deadline.value if self.deadline is not None else None

    def end_round(self, times: Sequence[float]) -> None:
        if self.deadline is not None:
            self.deadline.update(list(times))

    def state_dict(self) -> dict[str, Any]:
        return self.deadline.state_dict() if self.deadline is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.deadline is not None:
            self.deadline.load_state_dict(state)


class FreezeFLClient(PolicySession):
    """One client's probe and choice in one round."""

    policy: FreezeFL

    def __init__(self, policy: FreezeFL, task: ClientTask) -> None:
        super().__init__(policy, task)
        self.decided = False
        self.n_frozen = 0
        self.importance: list[float] = []
        self.num_units: int | None = None

    def trainable_units(self, ctx: StepCtx) -> range:
        self.num_units = ctx.num_units
        if not self.decided:
            return range(ctx.num_units)
        return range(min(self.n_frozen, ctx.num_units - 1), ctx.num_units)

    def end_of_epoch(self, ctx: EpochCtx) -> EpochAction | None:
        if ctx.epoch != 1 or self.decided:  # decided: epoch 1 of a restarted round
            return None
        num_units = self.num_units if self.num_units is not None else ctx.space.num_units
        deadline, tau = _round_config(self.task, num_units)
        scores = importance(ctx.local, ctx.received, ctx.space, self.policy.params.importance)
        scores = scores[:num_units]  # units an algorithm adds are not the policy's
        n = choose_frozen(scores, deadline, tau, self.policy.params.beta)
        self.decided, self.n_frozen, self.importance = True, n, scores
        if n == 0:
            return None
        if self.policy.params.probe == "restart":
            return EpochAction(restart=True)
        return EpochAction(restore=tuple(range(n)))

    def finish(self, result: ClientResult) -> None:
        n = self.n_frozen if self.decided else 0
        tau = self.task.extra.get("tau")
        result.figures["n_frozen"] = n
        result.charged_time = float(tau[n]) if tau is not None and len(tau) > n else None
        result.info["importance"] = list(self.importance)


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


def charged_times(system: SystemModel, k: int, probe: str) -> list[float]:
    """tau_n of Eq. 3 for n = 0..L-1: the time client k is charged if it freezes n units.

    ``rollback`` (the paper, Algorithm 1): one full probe epoch, then E-1 epochs with the
    first n frozen. ``restart`` (the authors' code): the probe is not charged, E epochs with the
    first n frozen. Both: the full model down, units n+1..L up."""
    if probe not in PROBES:
        raise ValueError(f"unknown probe {probe!r}; known: {', '.join(PROBES)}")
    E = system.local_epochs
    out = []
    for n in range(system.num_units):
        if probe == "rollback":
            flops = system.train_cost(k, 0, 1) + system.train_cost(k, n, E - 1)
        else:
            flops = system.train_cost(k, n, E)
        out.append(system.time(k, flops, system.full_bytes, system.upload_bytes[n]))
    return out


class SoftDeadline:
    """The soft deadline (Eq. 1): T_0 given, T_{r+1} = (1 - g) T_r + g * mean_k t_k over the
    round's participants, g = ``ema`` (0.4 in the authors' code). ``value`` is the T_r the
    server sends this round."""

    def __init__(self, T0: float, ema: float) -> None:
        if not (math.isfinite(T0) and T0 > 0):
            raise ValueError(f"the initial soft deadline T0 must be positive; got {T0}")
        if not 0.0 <= ema <= 1.0:
            raise ValueError(f"the deadline EMA weight must be in [0, 1]; got {ema}")
        self.value = float(T0)
        self.ema = float(ema)

    def update(self, times: Sequence[float]) -> float:
        """Fold in the exchange times of this round's participants (Eq. 1); the new T."""
        if not times:
            raise ValueError("the soft deadline needs at least one exchange time")
        mean = sum(times) / len(times)
        self.value = (1.0 - self.ema) * self.value + self.ema * mean
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
