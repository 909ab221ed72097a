"""FedPart (Wang et al., "Why Go Full? Elevating Federated Learning Through Partial Network
Updates", NeurIPS 2024): each round every client trains, and sends, one layer or a few.

The paper's rule: after full-network warm-up rounds, *sequential updating* trains the layers one
at a time from shallow to deep, and *multi-round cycle training* repeats that pass, with rounds
of full-network training between the passes ("FedPart(Repeat)"). A layer here is a fedbug unit
(the model's ``units:`` cut decides what one is); the units are cut into groups of
``units_per_round`` consecutive units (the last group may be smaller), and with t = round - 1:

    t < warmup                     the full network
    s = t - warmup;  c, q = divmod(s, L + full_between)    with L = rounds_per_unit x len(seq)
    c >= cycles (when given)       the full network (the schedule is over)
    q >= L                         the full network (the rounds between cycles)
    otherwise                      group seq[q // rounds_per_unit]

where ``seq`` is the order of the groups in one cycle: ``forward`` 0..G-1 (shallow to deep, the
paper's), ``reverse`` G-1..0, ``v`` 0..G-1 then G-2..1 (shallow, deep, shallow). Which units
train is a pure function of the round, the same for every client and step. Options:
``fedpart: {rounds_per_unit: 2, warmup: 5, full_between: 5, cycles: null, order: forward,
units_per_round: 1}``. The server averages only what was trained (``aggregation: layerwise``,
``upload: partial``, sample weighting: FedAvg over the round's group).

The authors' code (FLAIR-Community/Fling, ``fling/pipeline/partial_model_pipeline.py`` at
faebd06) differs as follows; each difference is an option value here or said below:

* Its numbers are the defaults: 2 rounds per group, 5 warm-up rounds, 5 full rounds between
  cycles, one group per round. The paper's text reachable here (the abstract) names the
  strategies, not these numbers.
* It hard-codes 5 cycles for ResNet-8 (10 groups, 125 rounds) and the transformer (8 groups,
  105 rounds), 3 for ResNet-18 (21 groups, 141 rounds): ``cycles: 5`` / ``3`` reproduce it. Past
  the last cycle its schedule function leaves its result unbound and the run stops with an
  UnboundLocalError; ``cycles: null`` (the default) keeps cycling instead, ``cycles: N`` trains
  the full network after the N-th cycle.
* Its "FedPart(Base)" variant (commented out in the first version, 4464a46) has no full rounds
  between cycles: ``full_between: 0``.
* The first version's ``get_kwds`` had the orders ``roll`` (forward), ``roll+back`` (reverse)
  and ``V`` (period 2(G-1) groups: ``order: v``; the code divides by zero for one group, where
  ``v`` here is the single group). Under its per-model cycle blocks of 2G rounds a ``V`` cycle
  is cut to its forward half; ``v`` here is the whole V.
* Groups are name substrings, a conv with its norm layer, a shortcut on its own, the stem, the
  classifier: fedbug's default units of a ResNet, in the same order (checked on its ResNet-8
  and ResNet-18); its 3-layer transformer's groups (the embedding; per layer the attention,
  then both linears with both norms; the classifier) need a ``units:`` list.
* Its clients train with Adam (lr 1e-3 from its optimizer config: the ``lr`` passed to
  ``train`` is ignored) over the group's parameters only, fresh every round, as fedbug's
  clients do with ``optimizer: adam``.
* Its server averages weights, not updates, over all clients (it passes no participant list;
  equal at full participation, its setting), and never averages BatchNorm's running statistics:
  they stay on each client, and the first client's model is evaluated. fedbug averages a unit's
  float buffers with its weights (use BatchNorm without running statistics, or GroupNorm, to
  compare).
* Its server sends every client only the aggregated group. fedbug's clients download the whole
  model every round (``bytes_down``): under partial participation a client cannot be assumed to
  hold the units trained while it was away.

``benchmarks/equivalence/run_fling.py`` runs Fling's own code beside this policy (schedules of
every round; rounds of its ResNet-8): RESULTS.md there.
"""

from __future__ import annotations

import warnings
from math import ceil
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from fedbug.errors import ConfigError
from fedbug.policies.base import POLICIES, FreezePolicy, PolicyParams, StepCtx

if TYPE_CHECKING:
    from fedbug.core.layout import Layout

ORDERS = ("forward", "reverse", "v")


class FedPartParams(PolicyParams):
    """The config's ``fedpart:`` block."""

    rounds_per_unit: int = Field(
        2, ge=1, le=1_000_000, description="rounds each group of units trains in a cycle"
    )
    warmup: int = Field(
        5, ge=0, le=1_000_000, description="full-network rounds before the first cycle"
    )
    full_between: int = Field(
        5,
        ge=0,
        le=1_000_000,
        description="full-network rounds after each cycle (0: the code's FedPart(Base))",
    )
    cycles: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="cycles, then the full network (null: cycle for as long as the run lasts)",
    )
    order: Literal["forward", "reverse", "v"] = Field(
        "forward",
        description="forward: shallow to deep (the paper); reverse: deep to shallow; v: "
        "shallow to deep and back",
    )
    units_per_round: int = Field(
        1, ge=1, le=10_000, description="consecutive units trained together (a group)"
    )


def group_order(groups: int, order: str) -> tuple[int, ...]:
    """The groups (0-based, input to output) in the order one cycle trains them."""
    if order not in ORDERS:
        raise ConfigError(f"fedpart.order must be one of {', '.join(ORDERS)}; got {order!r}")
    forward = tuple(range(groups))
    if order == "forward":
        return forward
    if order == "reverse":
        return forward[::-1]
    return forward + tuple(range(groups - 2, 0, -1))


def check_units(params: FedPartParams, num_units: int) -> None:
    """Refuse a group wider than the model."""
    if params.units_per_round > num_units:
        raise ConfigError(
            f"fedpart.units_per_round={params.units_per_round} but the model has {num_units} "
            f"units; use 1..{num_units} (or cut the model into more units with units:)"
        )


def scheduled_group(round: int, num_units: int, params: FedPartParams) -> int | None:
    """The group (0-based) trained in ``round`` (1-based); None: the full network."""
    check_units(params, num_units)
    t = round - 1
    if t < params.warmup:
        return None
    seq = group_order(ceil(num_units / params.units_per_round), params.order)
    length = params.rounds_per_unit * len(seq)
    cycle, q = divmod(t - params.warmup, length + params.full_between)
    if params.cycles is not None and cycle >= params.cycles:
        return None
    if q >= length:
        return None
    return seq[q // params.rounds_per_unit]


def round_units(round: int, num_units: int, params: FedPartParams) -> range:
    """The units (0-based, ascending) every client trains in ``round``."""
    g = scheduled_group(round, num_units, params)
    if g is None:
        return range(num_units)
    k = params.units_per_round
    return range(g * k, min(num_units, (g + 1) * k))


@POLICIES.register("fedpart")
class FedPart(FreezePolicy):
    """FedPart: one group of units per round, cycled shallow to deep (see the module)."""

    name = "fedpart"
    params_cls = FedPartParams
    params: FedPartParams

    def __init__(self, params: FedPartParams | None = None) -> None:
        super().__init__(params)
        self.layout: Layout | None = None

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        if cfg.schedule != "none":
            return (
                f"policy: fedpart chooses the units of each round itself; a FedSeq schedule "
                f"on top (schedule: {cfg.schedule}) leaves rounds with no unit to train; use "
                "schedule: none"
            )
        return None

    def setup(self, layout: Layout) -> None:
        check_units(self.params, layout.policy_units)
        if self.params.units_per_round == layout.policy_units:
            warnings.warn(
                f"fedpart with units_per_round={self.params.units_per_round}, every unit of the "
                "model, trains the full network every round: it is FedAvg (policy: none)",
                stacklevel=2,
            )
        self.layout = layout

    def trainable_units(self, ctx: StepCtx) -> range:
        return round_units(ctx.round, ctx.num_units, self.params)

    def trained_sublayers(self, round: int, num_sublayers: int) -> list[int]:
        """The base sub-layers (1-based) holding a unit this round trains."""
        if self.layout is None:
            return super().trained_sublayers(round, num_sublayers)
        units = set(round_units(round, self.layout.policy_units, self.params))
        return [i + 1 for i, group in enumerate(self.layout.sublayers) if units & set(group)]
