"""FreezeFL's system model: heterogeneous devices, a simulated clock and the soft deadline.

FreezeFL (Sec. V-A) adds system heterogeneity to LEAF: every client k draws an *ability* a_k
(uniform, "the ability gap is up to six times", U(0.5, 3.0); the authors' code instead uses 8
evenly spaced tiers from 0.5 to 3.0 with equal numbers of clients), and its computation and
communication capabilities are proportional to it:

    c_k = compute_speed * a_k  (FLOPs per time unit),   b_k = bandwidth * a_k  (bytes per unit).

A client's *model exchange time* (Sec. III: download, training, upload) is

    t_k = (bytes_down + bytes_up) / b_k + FLOPs_k / c_k,

a round lasts as long as its slowest participant (Sec. III, "the time cost of a round depends on
the maximum of selected clients' model exchange time") and the clock is the sum of the round
lengths. Bytes are 4 per float sent (:meth:`fedbug.core.units.ParamSpace.bytes_of`, as the engine's
``bytes_down``/``bytes_up``). FLOPs_k is n_k samples times the per-sample training cost of the
configuration the client trains, with the first n of the L units frozen (n = 0..L-1, the rows
of FreezeFL Fig. 2, :func:`freeze_rows`): counted once with
``torch.utils.flop_counter`` on a real forward + backward (``cost: flops``), or, with ``cost:
measured``, the wall time of a forward + backward per sample on this machine, timed once and
saved with the run (:meth:`SystemModel.state_dict`) so a resume charges the same times.

Unset speeds are *calibrated*: a client of ability 1 holding the mean number of training samples
that trains the full model for E epochs and downloads and uploads the full model takes exactly
one time unit, ``comm_share`` of it (0.5, as the authors' constants make it) communicating.

The soft deadline of FreezeFL's Eq. 1 and the charged times tau_n of its Eq. 3 are that freezing
policy's own (its module in ``fedbug.policies``), computed from this model's
:meth:`SystemModel.train_cost`, :meth:`SystemModel.time` and upload bytes. A policy that trains
other unit sets than "all but the first n" (CoCoFL's contiguous blocks) reads their costs from
:class:`UnitCosts` (``SystemModel.unit_costs``) and :meth:`SystemModel.upload_bytes_of`.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from fedbug.core.flops import FlopCache, LossFn, StepCost, ce_loss
from fedbug.core.seeding import numpy_rng
from fedbug.core.units import ParamSpace, Unit


class SystemParams(BaseModel):
    """The ``system:`` config block (FreezeFL Sec. V-A).

    ``abilities``: ``uniform`` (the paper: a_k ~ U(ability_min, ability_max)), ``tiers`` (the
    authors' code: ``tiers`` evenly spaced levels from ability_min to ability_max, equal numbers
    of clients, assigned by a seeded permutation) or ``none`` (every a_k = 1). ``compute_speed``
    (FLOPs, or measured seconds, per time unit at ability 1) and ``bandwidth`` (bytes per time
    unit at ability 1) are calibrated when unset (see the module docstring), ``comm_share`` of
    the calibrated unit being communication. ``cost``: per-sample training cost counted in
    FLOPs (``flops``) or timed on this machine (``measured``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    abilities: Literal["none", "uniform", "tiers"] = Field(
        "uniform", description="uniform (paper), tiers (authors' code) or none (all 1)"
    )
    ability_min: float = Field(0.5, gt=0.0, allow_inf_nan=False, description="lowest a_k")
    ability_max: float = Field(3.0, gt=0.0, allow_inf_nan=False, description="highest a_k")
    tiers: int = Field(8, ge=2, le=1_000_000, description="ability levels with abilities: tiers")
    compute_speed: float | None = Field(
        None, gt=0.0, allow_inf_nan=False, description="FLOPs per time unit at ability 1"
    )
    bandwidth: float | None = Field(
        None, gt=0.0, allow_inf_nan=False, description="bytes per time unit at ability 1"
    )
    comm_share: float = Field(
        0.5, ge=0.0, le=1.0, description="share of the calibrated time unit spent communicating"
    )
    cost: Literal["flops", "measured"] = Field(
        "flops", description="per-sample cost: flop_counter FLOPs, or measured seconds"
    )

    @model_validator(mode="after")
    def _check(self) -> SystemParams:
        if self.ability_min > self.ability_max:
            raise ValueError(
                f"system.ability_min={self.ability_min:g} exceeds system.ability_max="
                f"{self.ability_max:g}; give ability_min <= ability_max"
            )
        return self


def draw_abilities(params: SystemParams, num_clients: int, seed: int) -> Tensor:
    """Every client's ability a_k (float64, length ``num_clients``), FreezeFL Sec. V-A.

    ``uniform``: a_k ~ U(ability_min, ability_max) from ``numpy_rng(seed, "abilities")``.
    ``tiers``: ``tiers`` levels evenly spaced from ability_min to ability_max, each given to
    floor(N / tiers) clients and the N mod tiers left over one each to the highest levels (the
    authors' code gives the whole remainder to the top level), dealt by a seeded permutation.
    ``none``: all 1."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be at least 1; got {num_clients}")
    if params.abilities == "none":
        return torch.ones(num_clients, dtype=torch.float64)
    rng = numpy_rng(seed, "abilities")
    if params.abilities == "uniform":
        values = rng.uniform(params.ability_min, params.ability_max, num_clients)
    else:
        levels = np.linspace(params.ability_min, params.ability_max, params.tiers)
        base, extra = divmod(num_clients, params.tiers)
        counts = [base + (1 if t >= params.tiers - extra else 0) for t in range(params.tiers)]
        tier_of = np.repeat(np.arange(params.tiers), counts)
        values = levels[tier_of[rng.permutation(num_clients)]]
    return torch.as_tensor(np.asarray(values, dtype=np.float64))


def _trainable_snapshot(model: nn.Module) -> tuple[bool, dict[str, bool]]:
    return model.training, {n: p.requires_grad for n, p in model.named_parameters()}


def _restore(model: nn.Module, snap: tuple[bool, dict[str, bool]]) -> None:
    training, flags = snap
    for n, p in model.named_parameters():
        p.requires_grad_(flags[n])
    model.zero_grad(set_to_none=True)
    model.train(training)


def freeze_rows(
    units: Sequence[Unit], space: ParamSpace, count: Callable[[Sequence[int]], int], batch: int
) -> list[dict[str, Any]]:
    """FreezeFL Fig. 2: for n = 0..L-1 frozen units (the first n), the training FLOPs of a
    sample and the upload bytes of the rest, each over the same with nothing frozen."""
    L = len(units)
    full = count(range(L))
    total_bytes = space.bytes_of([True] * L)
    rows = []
    for n in range(L):
        flops = count(range(n, L))
        up = space.bytes_of([u >= n for u in range(L)])
        rows.append(
            {
                "n_frozen": n,
                "frozen": [u.name for u in units[:n]],
                "flops_sample": flops / batch,
                "compute_ratio": flops / full,
                "upload_bytes": up,
                "comm_ratio": up / total_bytes,
            }
        )
    return rows


def count_per_sample_flops(
    model: nn.Module,
    units: Sequence[Unit],
    example_x: Tensor,
    example_y: Tensor,
    loss_fn: LossFn = ce_loss,
) -> list[float]:
    """Training FLOPs of one sample with the first n units frozen, n = 0..L-1 (FreezeFL Fig. 2).

    One forward + backward of ``loss_fn(model(example_x), example_y)`` per n, counted with
    ``torch.utils.flop_counter`` (:func:`freeze_rows`), divided by the batch size. The model's
    ``requires_grad`` flags and train/eval mode are restored afterwards."""
    snap = _trainable_snapshot(model)
    try:
        rows = freeze_flop_rows(FlopCache(model, loss_fn), units, example_x, example_y)
    finally:
        _restore(model, snap)
    return [float(r["flops_sample"]) for r in rows]


def freeze_flop_rows(
    cache: FlopCache, units: Sequence[Unit], example_x: Tensor, example_y: Tensor
) -> list[dict[str, Any]]:
    """:func:`freeze_rows` counted by ``cache`` (its model, its loss) on the example batch: the
    one count of FreezeFL Fig. 2 that the system model (:func:`count_per_sample_flops`) and
    ``fedbug cost`` both read."""
    return freeze_rows(
        units,
        ParamSpace(cache.model, list(units)),
        lambda trained: cache.units(units, trained, example_x, example_y),
        len(example_x),
    )


def measure_per_sample_time(
    model: nn.Module,
    units: Sequence[Unit],
    example_x: Tensor,
    example_y: Tensor,
    loss_fn: LossFn = ce_loss,
    repeats: int = 3,
) -> list[float]:
    """Wall seconds of one sample's forward + backward with the first n units frozen, n =
    0..L-1 (``cost: measured``).

    For each n: one warm-up step, then the median of ``repeats`` timed steps on the example
    batch, divided by its size (CUDA is synchronised around each step). Timed once per run:
    the engine saves the result (:meth:`SystemModel.state_dict`) rather than timing again on a
    resume, so the clock does not depend on the machine's load at restart."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1; got {repeats}")
    L = len(units)
    cuda = example_x.is_cuda
    snap = _trainable_snapshot(model)
    out = []
    try:
        model.train()
        for n in range(L):
            on = {p for u in units[n:] for p in u.params}
            for name, p in model.named_parameters():
                p.requires_grad_(name in on)
            times = []
            for i in range(repeats + 1):
                model.zero_grad(set_to_none=True)
                if cuda:
                    torch.cuda.synchronize(example_x.device)
                t0 = _time.perf_counter()
                loss_fn(model(example_x), example_y).backward()
                if cuda:
                    torch.cuda.synchronize(example_x.device)
                if i:  # the first is a warm-up
                    times.append(_time.perf_counter() - t0)
            out.append(float(np.median(times)) / len(example_x))
    finally:
        _restore(model, snap)
    return out


class UnitCosts:
    """What training any set of units costs, for a policy that trains other sets than "all but
    the first n" (CoCoFL's contiguous blocks): per-sample FLOPs and one step's memory, counted on
    demand, each set once, with :class:`~fedbug.core.flops.FlopCache` on a private copy of the
    model and the example batch. The units in ``always`` (an algorithm's own, after the policy's:
    FedROD's personal head) train in every count, as in every row of :func:`freeze_rows`."""

    def __init__(
        self,
        model: nn.Module,
        units: Sequence[Unit],
        example_x: Tensor,
        example_y: Tensor,
        loss_fn: LossFn = ce_loss,
        always: Sequence[int] = (),
    ) -> None:
        self.model = model
        self.units = list(units)
        self.always = tuple(always)
        self._x, self._y = example_x, example_y
        self._cache = FlopCache(model, loss_fn)
        #: bytes of the model's parameters and buffers, held in every configuration
        self.model_bytes = sum(
            t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())
        )

    def _cost(self, trained: Sequence[int]) -> StepCost:
        on = sorted({*(int(u) for u in trained), *self.always})
        return self._cache.unit_cost(self.units, on, self._x, self._y)

    def flops(self, trained: Sequence[int]) -> float:
        """Training FLOPs of one sample with the units in ``trained`` (and ``always``)
        trainable, the rest frozen."""
        return self._cost(trained).flops / len(self._y)

    def memory(self, trained: Sequence[int], batch_size: int, state_copies: int) -> float:
        """Bytes of one training step on a batch of ``batch_size`` with the units in ``trained``
        (and ``always``) trainable: the model's parameters and buffers, the activations autograd
        saves (counted on the example batch, scaled linearly to ``batch_size``), the trained
        parameters' gradients and ``state_copies`` copies of optimiser state for them
        (:func:`~fedbug.core.flops.optimizer_state_copies`)."""
        cost = self._cost(trained)
        step = cost.memory(state_copies)
        activations = step.activations * batch_size / len(self._y)
        return float(self.model_bytes + activations + step.gradients + step.optimizer)


def per_sample_costs(
    params: SystemParams,
    model: nn.Module,
    units: Sequence[Unit],
    example_x: Tensor,
    example_y: Tensor,
    loss_fn: LossFn = ce_loss,
) -> list[float]:
    """The per-sample cost of each configuration n = 0..L-1 as ``params.cost`` says."""
    if params.cost == "flops":
        return count_per_sample_flops(model, units, example_x, example_y, loss_fn)
    return measure_per_sample_time(model, units, example_x, example_y, loss_fn)


def _speed(given: float | None, work: float, share: float, what: str) -> float:
    """``given``, or the speed that does ``work`` in ``share`` of a time unit (inf if share is
    0: that part is free)."""
    if given is not None:
        return float(given)
    if share == 0.0:
        return math.inf
    if not work > 0.0:
        raise ValueError(
            f"cannot calibrate system.{what}: the calibrated work is {work:g}; give "
            f"system.{what} explicitly"
        )
    return work / share


class SystemModel:
    """Clients' speeds and exchange times (FreezeFL Sec. V-A).

    ``per_sample_flops[n]`` is the per-sample training cost with the first n of the L units
    frozen (:func:`count_per_sample_flops`, or seconds with ``cost: measured``);
    ``client_sizes[k]`` is client k's number of training samples; ``local_epochs`` is E.
    Abilities are drawn from ``seed`` (:func:`draw_abilities`).

    L is ``policy_units``: the units a freeze policy may freeze (default all); units an
    algorithm adds after them (FedROD's personal head) always train. Bytes count the units in
    ``shared`` (default all): what a client downloads and uploads; a unit kept on the client
    (FedBABU's head, FedROD's personal head) costs no communication. ``unit_costs`` counts any
    other trained unit set (:class:`UnitCosts`; None where not given)."""

    def __init__(
        self,
        params: SystemParams,
        space: ParamSpace,
        per_sample_flops: Sequence[float],
        client_sizes: Sequence[int],
        local_epochs: int,
        num_clients: int,
        seed: int,
        policy_units: int | None = None,
        shared: Sequence[bool] | None = None,
        unit_costs: UnitCosts | None = None,
    ) -> None:
        if len(client_sizes) != num_clients:
            raise ValueError(
                f"client_sizes has {len(client_sizes)} entries for {num_clients} clients"
            )
        if local_epochs < 1:
            raise ValueError(f"local_epochs must be at least 1; got {local_epochs}")
        if any(s < 0 for s in client_sizes):
            raise ValueError("client sizes must be non-negative")
        self.params = params
        self.num_units = space.num_units if policy_units is None else int(policy_units)
        if not 1 <= self.num_units <= space.num_units:
            raise ValueError(f"policy_units must be in 1..{space.num_units}; got {policy_units}")
        sent = [True] * space.num_units if shared is None else [bool(x) for x in shared]
        if len(sent) != space.num_units:
            raise ValueError(f"shared has {len(sent)} entries for {space.num_units} units")
        self.client_sizes = [int(s) for s in client_sizes]
        self.local_epochs = int(local_epochs)
        self.num_clients = int(num_clients)
        self.mean_size = sum(self.client_sizes) / num_clients
        # bytes: the full model down; units n+1..L up with the first n frozen
        self.full_bytes = space.bytes_of(sent)
        self.upload_bytes = [
            space.bytes_of([x and u >= n for u, x in enumerate(sent)])
            for n in range(self.num_units)
        ]
        self._space, self._sent = space, sent
        #: costs of any trained unit set (None: not counted, e.g. under ``cost: measured``)
        self.unit_costs = unit_costs
        self.abilities = draw_abilities(params, num_clients, seed)
        self._set_costs(per_sample_flops)

    def _set_costs(self, per_sample: Sequence[float]) -> None:
        costs = [float(c) for c in per_sample]
        if len(costs) != self.num_units:
            raise ValueError(
                f"per-sample costs: {len(costs)} entries for {self.num_units} units "
                "(one per n = 0..L-1 frozen)"
            )
        if any(not (math.isfinite(c) and c >= 0.0) for c in costs):
            raise ValueError(f"per-sample costs must be finite and non-negative; got {costs}")
        self.per_sample = costs
        p = self.params
        work = self.local_epochs * self.mean_size * costs[0]
        self.compute_speed = _speed(p.compute_speed, work, 1.0 - p.comm_share, "compute_speed")
        if self.full_bytes == 0 and p.bandwidth is None:  # nothing is sent (local-only training)
            self.bandwidth = math.inf
        else:
            self.bandwidth = _speed(p.bandwidth, 2.0 * self.full_bytes, p.comm_share, "bandwidth")

    def ability(self, k: int) -> float:
        return float(self.abilities[k])

    def speeds(self, k: int) -> tuple[float, float]:
        """(c_k, b_k) = (compute_speed * a_k, bandwidth * a_k): FLOPs (or measured seconds)
        and bytes client k processes per time unit."""
        a = self.ability(k)
        return self.compute_speed * a, self.bandwidth * a

    def time(self, k: int, flops: float, bytes_down: float, bytes_up: float) -> float:
        """t_k = (bytes_down + bytes_up) / b_k + flops / c_k, client k's model exchange time."""
        c, b = self.speeds(k)
        return (bytes_down + bytes_up) / b + flops / c

    def train_cost(self, k: int, n_frozen: int, epochs: float) -> float:
        """FLOPs of ``epochs`` epochs over client k's samples with the first n units frozen."""
        return epochs * self.client_sizes[k] * self.per_sample[n_frozen]

    def upload_bytes_of(self, trained: Sequence[int]) -> int:
        """Bytes a client uploads when it trains the policy's units in ``trained`` (and the
        units an algorithm adds after them): those of them that are shared."""
        on = {int(u) for u in trained}
        return self._space.bytes_of(
            [x and (u in on or u >= self.num_units) for u, x in enumerate(self._sent)]
        )

    def full_time(self, k: int) -> float:
        """Client k's exchange time with nothing frozen: E full epochs, full model down and up."""
        return self.time(
            k, self.train_cost(k, 0, self.local_epochs), self.full_bytes, self.full_bytes
        )

    def summary(self) -> dict[str, Any]:
        """JSON-ready description for a run's summary: speeds, costs, bytes and abilities."""
        return {
            "abilities": [float(a) for a in self.abilities],
            "compute_speed": self.compute_speed,
            "bandwidth": self.bandwidth,
            "cost": self.params.cost,
            "per_sample": list(self.per_sample),
            "full_bytes": self.full_bytes,
            "upload_bytes": list(self.upload_bytes),
            "mean_size": self.mean_size,
        }

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs: the per-sample costs (measured ones are never timed again).
        Abilities are re-drawn from the seed."""
        return {"per_sample": list(self.per_sample)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._set_costs(state["per_sample"])


def round_length(times: Sequence[float]) -> float:
    """A round lasts as long as its slowest participant (FreezeFL Sec. III)."""
    if not times:
        raise ValueError("a round needs at least one participant's time")
    return max(float(t) for t in times)


class Clock:
    """The simulated clock: the sum of the round lengths so far."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, times: Sequence[float]) -> float:
        """Add one round of participants' ``times``; the round's length."""
        length = round_length(times)
        self.now += length
        return length

    def state_dict(self) -> dict[str, float]:
        return {"now": self.now}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.now = float(state["now"])
