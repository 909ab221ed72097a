"""The one builder of what a run trains: from a config and a model, the model as the run's
algorithm wraps it, cut into units, laid out into base, head and the algorithm's own units, and
the freeze policy (with FedSeq's round schedule) that acts on those units.

Every place that needs these builds them here: the engine's :class:`~fedbug.engine.experiment.
ClientSide` (so worker processes and Flower nodes too) and ``fedbug cost``. A config therefore
means the same units everywhere: unit names a config lists (``units:``, ``sublayers:``) or the
model declares (``fedbug_units()``) name the model's own submodules, and are renamed here to
where the algorithm's wrapper puts them (FedROD's ``PersonalHeadModel`` holds the model as
``body``), with the algorithm's own units added last.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

from torch import Tensor, nn

from fedbug.algorithms import Algorithm
from fedbug.config import BaseConfig
from fedbug.core.blocks import block_units
from fedbug.core.layout import Layout, build_layout, extra_units
from fedbug.core.units import (
    ParamSpace,
    Unit,
    UnitNames,
    check_traced,
    declared_units,
    find_units,
    renamed_units,
    traced_module_order,
    unit_renamer,
)
from fedbug.errors import ConfigError
from fedbug.policies import FreezePolicy, StepCtx, build_policy
from fedbug.policies.base import Intersection
from fedbug.policies.schedule import RoundSchedule


@dataclass
class Parts:
    """What a run trains, built by :func:`build_parts`."""

    #: the last parameter-owning layer the model's forward pass calls
    classifier: str
    #: the model as the algorithm wraps it (the clients' and the evaluators' template)
    template: nn.Module
    units: list[Unit]
    space: ParamSpace
    layout: Layout
    #: per unit: whether clients and server exchange it (the rest stay on each client)
    shared_mask: list[bool]
    #: the freeze policy, intersected with the round schedule where there is one
    policy: FreezePolicy
    schedule: RoundSchedule | None

    @property
    def policy_units(self) -> int:
        """The units a freeze policy sees: the model's own, not those the algorithm adds."""
        return self.layout.policy_units


def build_parts(cfg: BaseConfig, algorithm: Algorithm, model: nn.Module, example: Tensor) -> Parts:
    """Wrap ``model`` for ``algorithm``, cut it into units on the prepared batch ``example``,
    lay them out, set the algorithm up on the layout and the run (``setup_run``), and build the
    config's freeze policy and round schedule on it. ``model`` becomes part of the template:
    pass a copy to keep it."""
    blocks = cfg.units == "blocks" or (cfg.units is None and cfg.adapters is not None)
    if blocks:  # embedding, each repeated block, head (fedbug.core.blocks)
        listed: UnitNames | None = block_units(model, example)
    else:
        listed = cfg.units if cfg.units is not None else declared_units(model)
    classifier = classifier_of(model, example, listed)
    template = algorithm.wrap_model(model, classifier)
    rename = unit_renamer(model, template)
    names = None
    if listed is not None:
        names = [*renamed_units(listed, rename), *algorithm.extra_modules]
    units = find_units(template, example, names=names)
    space = ParamSpace(template, units)
    sublayers = cfg.sublayers
    if isinstance(sublayers, list):
        sublayers = [[rename(n) for n in group] for group in sublayers]
    own = len(units) - len(extra_units(units, algorithm.extra_modules))
    layout = build_layout(
        units, head_units(cfg, algorithm, own), sublayers, algorithm.extra_modules
    )
    algorithm.setup(layout)
    check_global_model(algorithm, layout)
    algorithm.setup_run(cfg, example)  # its refusals come before any run folder
    policy, schedule = build_freezing(cfg, layout)
    return Parts(
        classifier,
        template,
        units,
        space,
        layout,
        algorithm.shared_mask(space.num_units),
        policy,
        schedule,
    )


def check_global_model(algorithm: Algorithm, layout: Layout) -> None:
    """Refuse (TypeError naming the class) an algorithm that keeps units of the model itself on
    its clients (``local_units``) yet says the server's weights are a model to evaluate
    (``has_global_model``): they would miss those units, and global evaluation would score
    units no round trained. The units ``wrap_model`` adds (FedROD's personal head) may stay on
    the clients beside a global model. Checked once the units are known, as the class body
    cannot see them."""
    kept = [u for u in algorithm.local_units(layout.num_units) if u < layout.policy_units]
    if algorithm.has_global_model and kept:
        who = type(algorithm).__qualname__
        raise TypeError(
            f"algorithm class {who} keeps model unit(s) {kept} on its clients (local_units) "
            "but has_global_model is True, so the server's weights, evaluated as the global "
            "model, would miss them; set has_global_model = False (evaluation: personalized) "
            "or keep only the units wrap_model adds (extra_modules)"
        )


def head_units(cfg: BaseConfig, algorithm: Algorithm, own: int) -> int:
    """``head_units``, fewer where the model has too few (``own``) units and nothing needs its
    head apart (a one-unit model under FedAvg: all base); personalized methods and FedSeq's
    schedule keep it and refuse a model too small for it."""
    if algorithm.splits_body_head or cfg.schedule != "none":
        if cfg.head_units >= own:
            who = cfg.algorithm if algorithm.splits_body_head else "a FedSeq schedule"
            raise ConfigError(
                f"{who} keeps a head of {cfg.head_units} unit(s) apart from the base, but this "
                f"model has {own} unit(s); use a model with more units (or fewer head_units)"
            )
        return cfg.head_units
    return min(cfg.head_units, own - 1)


def build_freezing(cfg: BaseConfig, layout: Layout) -> tuple[FreezePolicy, RoundSchedule | None]:
    """The config's freeze policy on ``layout``, intersected with its round schedule (FedSeq)
    where it has one; a pair that trains no unit (at the first step, or in a round the
    schedule unfreezes) is refused."""
    n = layout.policy_units
    policy = build_policy(cfg.policy, cfg.options(cfg.policy))
    policy.setup(layout)
    if not _trains_any(policy, StepCtx(1, 1, n)):
        raise ConfigError(f"policy {cfg.policy!r} trains no unit of this model")
    if cfg.schedule == "none":
        return policy, None
    schedule = RoundSchedule.build(cfg.schedule, layout.sublayers, cfg.rounds, cfg.unfreeze_rounds)
    both = Intersection((policy, schedule))
    for t in sorted({t + 1 for t in schedule.unfreeze_rounds}):
        if not _trains_any(both, StepCtx(1, 1, n, t, 0, cfg.rounds)):
            raise ConfigError(
                f"policy {cfg.policy!r} under schedule {cfg.schedule!r} trains no unit in round "
                f"{t}; use another policy or schedule"
            )
    return both, schedule


def _trains_any(policy: FreezePolicy, ctx: StepCtx) -> bool:
    """Whether ``policy`` trains a unit at ``ctx``, asked of a copy with its warnings off: the
    check's one-step context is no client's, so what the policy would say of it (a GU stage
    too short for one step) is not said, and the policy still says it for a real client."""
    try:
        asked = copy.deepcopy(policy)
    except (TypeError, copy.Error):  # a user's policy holding a lock or a file: the policy itself
        asked = policy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return len(asked.trainable_units(ctx)) > 0


def classifier_of(model: nn.Module, example: Tensor, units: UnitNames | None = None) -> str:
    """The model's classifier: the last parameter-owning layer its forward pass calls. A
    forward pass that reads a layer's weights without calling it is refused
    (:func:`~fedbug.core.units.check_traced`) unless the units are listed (``units:`` or
    ``fedbug_units()``); if it then calls no such layer, the last listed unit's last layer."""
    order = traced_module_order(model, example)
    if not units:
        check_traced(model, order)
    if order:
        return order[-1]
    last = units[-1] if units else ""
    return last if isinstance(last, str) else list(last)[-1]
