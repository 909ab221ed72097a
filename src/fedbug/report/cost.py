"""Training cost of freezing, computed from a config without loading any data.

Two tables, both from the config's model on its data set's input shape:

* FreezeFL Fig. 2 (``rows``): with the first n of the L units frozen (n = 0..L-1), the
  training FLOPs of a sample (forward + backward, counted with ``torch.utils.flop_counter``)
  and the upload bytes of units n+1..L, each over the same with nothing frozen; and a step's
  memory (``peak_mem``: activations saved for backward, gradients and the config optimiser's
  state for the trained parameters, :class:`~fedbug.core.flops.StepMemory`), as each method's
  phases (and ``peak_mem``, their largest) give it too.
* FedSeq Sec. 5.2 / Table 6 (``methods``): the config's own method first (its algorithm,
  policy and schedule, named as a sweep names it, :func:`~fedbug.report.groups.method_name`:
  ``fedrep``, ``fedavg+bottom_up``), unless it is one of the others: FedAvg, FedBABU, FedSeq
  vanilla and anti, FedROD. A method the config's model cannot run (FedBABU's head on a one-unit
  model) is left out with why (``left_out``); the config's own method and FedAvg are not, nor
  one the config's own ``head_units``, ``sublayers`` or ``unfreeze_rounds`` refuse.
  ``paper_flops`` is the paper's proxy, sum over rounds t of P(t) * B * E * N with P(t) the
  parameters trained in round t, B = ceil(samples_per_client / batch_size) batches, E local
  epochs and N clients (every client every round, as the paper counts; ``participants``: the
  expected r * N). ``flops`` multiplies the same way the FLOPs counted for one batch of each
  phase's trainable set: a frozen unit gets no weight gradient and autograd does no backward
  below the lowest trainable unit, so a frozen *shallow* unit still costs the backward through
  every unit above it. ``upload_params``: the parameters one client uploads over all rounds
  (with ``participants``, in the r share of rounds it is expected to join). A config's
  ``local_steps`` replaces B * E: B * E (or K) is each method's client session's own count
  (``local_step_count``, under the run's :func:`~fedbug.engine.experiment.train_settings`).
  ``upload_params`` is a total over the run: each round a client uploads every shared unit
  trained at any of its steps.

The input shape, classes and input kind are the data set's declaration in the data registry
(:func:`~fedbug.data.dataset_shape`, under the config's ``dataset_options``); Fig. 2's FLOPs are
the system model's count (:func:`~fedbug.system.freeze_flop_rows`).

Each method is built as a run of it would be, by the real classes: its algorithm
(:func:`~fedbug.algorithms.build_algorithm`: the model it wraps, e.g. FedROD's personal head,
its loss on the example batch's labels, the units it allows and shares), and its units, layout
and freezing (policy and FedSeq's schedule) by the engine's own builder
(:mod:`fedbug.engine.build`: ``units``, ``head_units``, ``sublayers``, ``rounds``,
``unfreeze_rounds``). A phase is a run of rounds whose local steps train the same units step by
step, split where the units change within a round (``steps``: FedRep's head steps, then its base;
FedBug unfreezing a unit more every few steps). A policy that decides from training (a probe at
an epoch's end) is counted as it starts, with no data seen. The config's ``units`` name the
model's submodules;
a method that wraps the model finds them under their new names. The fine-tuning rounds after T
are not counted (nor does the paper).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from fedbug.algorithms import ALGORITHMS, Algorithm, build_algorithm
from fedbug.algorithms.base import ClientSession
from fedbug.config import apply_method
from fedbug.core.flops import FlopCache, optimizer_state_copies
from fedbug.core.layout import Layout
from fedbug.core.protocol import TrainSettings
from fedbug.core.tasks import TASKS, build_task
from fedbug.core.units import ParamSpace, Unit
from fedbug.data import DataShape, dataset_shape
from fedbug.data.targets import ONE_POSITION_FIX, next_tokens
from fedbug.engine.build import build_freezing, build_parts
from fedbug.engine.client import step_units
from fedbug.engine.counting import counting_session
from fedbug.engine.experiment import train_settings
from fedbug.errors import ConfigError
from fedbug.models import build_model, model_kwargs
from fedbug.policies import FreezePolicy, StepCtx
from fedbug.policies.schedule import RoundSchedule
from fedbug.report.groups import method_name
from fedbug.system import freeze_flop_rows

# each a ``method:`` of a config (a preset, or an algorithm's name)
METHODS = ("fedavg", "fedbabu", "fedseq-vanilla", "fedseq-anti", "fedrod")
LABELS = {
    "fedavg": "FedAvg",
    "fedbabu": "FedBABU",
    "fedseq-vanilla": "FedSeq vanilla",
    "fedseq-anti": "FedSeq anti",
    "fedrod": "FedROD",
}
DEFAULT_SAMPLES_PER_CLIENT = 500
#: the keys the rows read that the config's method may not: set, a row refused refuses the report
ROW_KEYS = frozenset({"head_units", "sublayers", "unfreeze_rounds"})
UPLOAD_HEADER = "params uploaded/client over the run"

T = TypeVar("T")
#: a round's local steps: (first step, last step, the units they train), runs of equal units
Steps = tuple[tuple[int, int, tuple[int, ...]], ...]
Phases = list[tuple[int, int, Steps]]


def _example_batch(
    shape: DataShape, batch: int, seed: int, targets: str = "last"
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of random inputs and labels; under ``targets: every`` a causal LM's targets at
    every position (the window shifted by one, then the sequence's own), as a run trains."""
    gen = torch.Generator().manual_seed(seed)
    classes = shape.num_classes
    if shape.inputs == "tokens":
        x = torch.randint(0, classes, (batch, *shape.input_shape), generator=gen)
    else:
        x = torch.rand((batch, *shape.input_shape), generator=gen)
    y = torch.randint(0, classes, (batch,), generator=gen)
    if targets == "every" and shape.inputs == "tokens":
        y = next_tokens(x, y)
    return x, y


def refused(cfg: Any, method: str) -> str | None:
    """Why a run of ``method`` on this config would be refused (its algorithm's own check, on
    the config with that algorithm), or None: such a method is left out of the tables."""
    algorithm = apply_method({"method": method})["algorithm"]
    return ALGORITHMS.get(algorithm).check_config(cfg.model_copy(update={"algorithm": algorithm}))


def round_phases(units_of_round: Callable[[int], T], rounds: int) -> list[tuple[int, int, T]]:
    """Rounds 1..``rounds`` as phases (first round, last round, trained units): runs of
    consecutive rounds that train the same units (also used for the steps of a round)."""
    phases: list[tuple[int, int, T]] = []
    for t in range(1, rounds + 1):
        units = units_of_round(t)
        if phases and phases[-1][2] == units:
            phases[-1] = (phases[-1][0], t, units)
        else:
            phases.append((t, t, units))
    return phases


@dataclass(frozen=True)
class Setting:
    """What the tables count: the data set's declared shape (:func:`~fedbug.data.dataset_shape`),
    a run's training settings (:func:`~fedbug.engine.experiment.train_settings`), the samples of
    every client and the clients counted a round (``clients``: all, or the expected
    participants)."""

    dataset: str
    model: str
    shape: DataShape
    settings: TrainSettings
    rounds: int
    samples_per_client: int
    num_clients: int
    clients: float
    participants: bool


def _setting(cfg: Any, samples_per_client: int | None, participants: bool) -> Setting:
    shape = dataset_shape(cfg.dataset, cfg.dataset_options)
    spc = DEFAULT_SAMPLES_PER_CLIENT if samples_per_client is None else int(samples_per_client)
    if spc < 1:
        raise ConfigError(f"samples_per_client must be at least 1; got {spc}")
    if participants:
        if cfg.clients_per_round is not None:
            clients = float(cfg.clients_per_round)
        else:
            clients = cfg.participation * cfg.num_clients
    else:
        clients = float(cfg.num_clients)
    return Setting(
        cfg.dataset,
        cfg.model,
        shape,
        train_settings(cfg),
        cfg.rounds,
        spc,
        cfg.num_clients,
        clients,
        participants,
    )


@dataclass
class Built:
    """One algorithm on the config's model: the (wrapped) model's units and layout, its client
    session on the example batch (its loss, its local step count: ``steps`` a round of
    ``per_epoch`` an epoch) and the FLOP counts of its trainable sets."""

    algorithm: Algorithm
    units: list[Unit]
    space: ParamSpace
    layout: Layout
    session: ClientSession
    flops: FlopCache
    steps: int
    per_epoch: int


def _build(
    cfg: Any, name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, s: Setting
) -> Built:
    """Algorithm ``name`` on a copy of ``model``, built as a run of it builds it
    (:func:`~fedbug.engine.build.build_parts`), with its client session on the example batch:
    round 1's task (from the engine's builder, :func:`~fedbug.engine.client_task.client_task`,
    as the round loop builds it) to a client of ``samples_per_client`` samples (the run's mean
    too: no data is loaded; no payload nor per-client config, which none of these methods
    sends), and the local steps that session counts for it."""
    task = build_task(cfg.task) if cfg.task in TASKS else None  # the run's loss (next_token)
    alg = build_algorithm(name, cfg.global_lr, {name: cfg.options(name)}, task)
    plain = cfg.model_copy(update={"algorithm": name, "policy": "none", "schedule": "none"})
    parts = build_parts(plain, alg, copy.deepcopy(model), x[:1])
    session = counting_session(cfg, alg, y, s.samples_per_client)  # the engine's loss too
    steps, per_epoch = session.local_step_count(s.samples_per_client, s.settings)
    flops = FlopCache(parts.template, session.loss)
    return Built(alg, parts.units, parts.space, parts.layout, session, flops, steps, per_epoch)


def _phases(b: Built, freezing: FreezePolicy, s: Setting) -> Phases:
    """The units each local step of each round trains, as a client of the method trains them
    (its freeze policy's, less those its algorithm does not allow at that step)."""
    policy = freezing.start_client(b.session.task)

    def steps_of_round(t: int) -> Steps:
        def units(k: int) -> tuple[int, ...]:
            step = StepCtx(k, b.steps, b.layout.policy_units, t, 0, s.rounds)
            return tuple(sorted(step_units(policy, b.session, step, b.per_epoch, b.layout.extra)))

        return tuple(round_phases(units, b.steps))

    return round_phases(steps_of_round, s.rounds)


def _count(value: float) -> int:
    return int(round(value))


def cost_report(
    cfg: Any, samples_per_client: int | None = None, participants: bool = False
) -> dict[str, Any]:
    """Both tables for a validated config (see the module docstring). Loads no data."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small batches: counting is fastest, and the counts the same
    try:
        return _cost_report(cfg, samples_per_client, participants)
    finally:
        torch.set_num_threads(threads)


def _method_phases(
    b: Built,
    phases: Phases,
    x: torch.Tensor,
    y: torch.Tensor,
    copies: int,
    clients: float,
    full_upload: bool = False,
) -> list[dict[str, Any]]:
    """Each phase of a method (its rounds, and its steps within them): the units it trains,
    their parameters (trained; uploaded: the shared ones no earlier step of the round trained,
    as a round uploads each trained unit once; under ``upload: full`` every shared unit, counted
    at a round's first step), a batch's measured FLOPs and step memory, and
    its FLOPs measured and by the paper's proxy (parameters x batches, ``clients`` counted)."""
    names = [u.name for u in b.units]
    params = b.space.unit_param_numel
    shared = b.algorithm.shared_mask(len(b.units))
    out = []
    for first, last, steps in phases:
        seen: set[int] = set()
        for a, z, trained in steps:
            batches = (z - a + 1) * (last - first + 1) * clients
            p = sum(params[u] for u in trained)
            step = b.flops.unit_cost(b.units, trained, x, y)
            new, seen = set(trained) - seen, seen | set(trained)
            if full_upload:
                new = set(range(len(params))) if a == steps[0][0] else set()
            out.append(
                {
                    "rounds": [first, last],
                    "steps": [a, z],
                    "units": [names[u] for u in trained],
                    "params": p,
                    "upload_params": sum(params[u] for u in new if shared[u]),
                    "flops_batch": step.flops,
                    "paper_flops": _count(p * batches),
                    "flops": _count(step.flops * batches),
                    "peak_mem": step.memory(copies).total,
                }
            )
    return out


def _method_totals(out: list[dict[str, Any]], share: float) -> dict[str, Any]:
    """A method's totals over its phases (uploads by the share of clients counted)."""
    uploads = sum(ph["upload_params"] * (ph["rounds"][1] - ph["rounds"][0] + 1) for ph in out)
    return {
        "paper_flops": sum(ph["paper_flops"] for ph in out),
        "flops": sum(ph["flops"] for ph in out),
        "upload_params": _count(share * uploads),
        "peak_mem": max(ph["peak_mem"] for ph in out),
        "phases": out,
    }


def _model_and_example(cfg: Any, s: Setting) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The config's model on the data set's declared shape and a random example batch of the
    run's batch size (under ``targets: every``, refused where the model scores one position)."""
    shape = s.shape
    model = build_model(
        cfg.model, shape.input_shape, shape.num_classes, cfg.seed, **model_kwargs(cfg)
    )
    targets = getattr(cfg, "targets", "last")
    x, y = _example_batch(shape, s.settings.batch_size, cfg.seed, targets)
    if y.dim() == 2:  # targets: every: the model must score every position
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            scores = model.eval()(x[:1])
        model.train()
        if scores.dim() != 3:
            raise ConfigError(
                f"model {cfg.model} gives one score row a sequence, {tuple(scores.shape)}, "
                f"for targets at each of its {y.shape[1]} positions ({ONE_POSITION_FIX})"
            )
    return model, x, y


@dataclass
class Counted:
    """The FedSeq table's methods: each algorithm built once, each method's totals, the
    schedules FedSeq's methods use and the methods this config cannot run (with why)."""

    builds: dict[str, Built]
    methods: dict[str, Any]
    schedules: list[RoundSchedule]
    left_out: dict[str, str]


def _row_configs(cfg: Any) -> dict[str, Any]:
    """The config of each row: the config's own method first (named as a sweep names it)
    unless a row of :data:`METHODS` runs the same algorithm, policy and schedule; each of
    :data:`METHODS` with the config's options but no freeze policy of the config's."""
    rows = {}
    for method in METHODS:
        doc = apply_method({"method": method})
        update = {"algorithm": doc["algorithm"], "policy": "none"}
        rows[method] = cfg.model_copy(update={**update, "schedule": doc.get("schedule", "none")})
    own = (cfg.algorithm, cfg.policy, cfg.schedule)
    if any((r.algorithm, r.policy, r.schedule) == own for r in rows.values()):
        return rows
    name = method_name(cfg.model_dump())
    if name in rows:  # a preset's name over another policy: its parts name it
        name = method_name({**cfg.model_dump(), "method": None})
    return {name: cfg, **rows}


def _count_methods(
    cfg: Any, s: Setting, model: nn.Module, x: torch.Tensor, y: torch.Tensor, copies: int
) -> Counted:
    """Each row this config can run, counted as a run of it trains; a row of :data:`METHODS`
    its model cannot take is left out with why. FedAvg and the config's own method refuse, as
    does any row where the config sets a key of :data:`ROW_KEYS` (the user's, to fix)."""
    given = ROW_KEYS & cfg.model_fields_set
    counted = Counted({}, {}, [], {})
    counted.left_out = {m: why for m in METHODS if m != "fedavg" and (why := refused(cfg, m))}
    rows = _row_configs(cfg)
    for name, row in rows.items():
        if name in counted.left_out:
            continue
        try:
            counted.methods[name] = _count_method(row, counted, s, (model, x, y), copies)
        except ConfigError as e:
            if name == "fedavg" or name not in METHODS or given:
                raise
            counted.left_out[name] = str(e)
        except ValueError as e:  # a session only a round can start (counting_session)
            counted.left_out[name] = str(e)
    return counted


def _count_method(
    row: Any,
    counted: Counted,
    s: Setting,
    example: tuple[nn.Module, torch.Tensor, torch.Tensor],
    copies: int,
) -> dict[str, Any]:
    """One row's totals: its algorithm built (once per algorithm), its freezing on its
    layout (:func:`~fedbug.engine.build.build_freezing`), its steps counted phase by phase."""
    model, x, y = example
    if row.algorithm not in counted.builds:
        counted.builds[row.algorithm] = _build(row, row.algorithm, model, x, y, s)
    b = counted.builds[row.algorithm]
    freezing, schedule = build_freezing(row, b.layout)
    if schedule is not None:
        counted.schedules.append(schedule)
    full = row.upload == "full"
    out = _method_phases(b, _phases(b, freezing, s), x, y, copies, s.clients, full)
    return _method_totals(out, s.clients / s.num_clients)


def _fig2_rows(plain: Built, x: torch.Tensor, y: torch.Tensor, copies: int) -> list[dict[str, Any]]:
    """FreezeFL Fig. 2 on FedAvg's model (the system model's count,
    :func:`~fedbug.system.freeze_flop_rows`), with a step's memory with the first n frozen."""
    units = plain.units
    rows = freeze_flop_rows(plain.flops, units, x, y)
    for r in rows:  # counted with its FLOPs: the cache holds both
        step = plain.flops.unit_cost(units, range(r["n_frozen"], len(units)), x, y)
        r["peak_mem"] = step.memory(copies).total
    return rows


def _setting_figures(
    s: Setting, plain: Built, counted: Counted, copies: int, x: torch.Tensor, y: torch.Tensor
) -> dict[str, Any]:
    """The report's ``setting``: what was counted, on FedAvg's model and its step count."""
    units, layout, settings = plain.units, plain.layout, s.settings
    names = [u.name for u in units]
    schedules = counted.schedules
    return {
        "dataset": s.dataset,
        "model": s.model,
        "input_shape": list(s.shape.input_shape),
        "num_classes": s.shape.num_classes,
        "units": names,
        "head": [names[u] for u in layout.head],
        "sublayers": [[names[u] for u in g] for g in layout.sublayers],
        "unfreeze_rounds": list(schedules[0].unfreeze_rounds) if schedules else [],
        "rounds": s.rounds,
        "batch_size": settings.batch_size,
        "samples_per_client": s.samples_per_client,
        "batches_per_epoch": plain.per_epoch,
        "local_epochs": settings.local_epochs,
        "local_steps": plain.steps,
        "num_clients": s.num_clients,
        "clients_counted": s.clients,
        "participants": s.participants,
        "params": sum(plain.space.unit_param_numel),
        "flops_batch_full": plain.flops.units(units, range(len(units)), x, y),
        "optimizer_state_copies": copies,
        "torch": torch.__version__,
    }


def _cost_report(cfg: Any, samples_per_client: int | None, participants: bool) -> dict[str, Any]:
    s = _setting(cfg, samples_per_client, participants)
    model, x, y = _model_and_example(cfg, s)
    copies = optimizer_state_copies(s.settings.optimizer, s.settings.momentum)
    counted = _count_methods(cfg, s, model, x, y, copies)
    plain = counted.builds["fedavg"]  # Fig. 2 and the setting: the config's model as it is
    return {
        "rows": _fig2_rows(plain, x, y, copies),
        "methods": counted.methods,
        "setting": _setting_figures(s, plain, counted, copies, x, y),
        "left_out": counted.left_out,
    }


def _billions(flops: int) -> str:
    return f"{flops / 1e9:,.3f} billion"


def _ratio(report: dict[str, Any], name: str, key: str) -> float:
    m = report["methods"]
    return m[name][key] / m["fedavg"][key]


def format_cost_report(report: dict[str, Any]) -> str:
    """The two tables and the proxy-versus-measured comparison, as text."""
    lines = [*_fig2_lines(report), "", *_table6_lines(report), "", *_measured_lines(report)]
    lines += ["", comparison_sentence(report)]
    for name, reason in report.get("left_out", {}).items():
        lines.append(f"not counted: {_label(name)}, which this config cannot run ({reason})")
    return "\n".join(lines)


def _counted(report: dict[str, Any]) -> list[str]:
    """The methods counted, in the table's order (the config's own first)."""
    return list(report["methods"])


def _label(name: str) -> str:
    """A row's name in the text: FedSeq's for its methods, the sweep's for the config's."""
    return LABELS.get(name, name)


def _name_width(report: dict[str, Any]) -> int:
    """The width of the rows' names: the longest (15 at least)."""
    return max(15, *(len(_label(n)) for n in report["methods"]))


def _fig2_lines(report: dict[str, Any]) -> list[str]:
    """FreezeFL Fig. 2: a row for each number of units frozen."""
    st = report["setting"]
    lines = [
        f"FreezeFL Fig. 2: {st['model']} on {st['dataset']} "
        f"({'x'.join(map(str, st['input_shape']))}, {st['num_classes']} classes), "
        f"{len(st['units'])} units; the first n frozen",
        f"{'n frozen':>8}  {'frozen units':<28} {'FLOPs a sample':>16} {'compute':>8} "
        f"{'upload bytes':>14} {'comm':>6} {'step memory':>12}",
    ]
    for r in report["rows"]:
        frozen = ", ".join(r["frozen"]) or "-"
        lines.append(
            f"{r['n_frozen']:>8}  {frozen:<28} {r['flops_sample']:>16,.0f} "
            f"{r['compute_ratio']:>8.3f} {r['upload_bytes']:>14,} {r['comm_ratio']:>6.3f} "
            f"{r['peak_mem']:>12,}"
        )
    return lines


def _table6_lines(report: dict[str, Any]) -> list[str]:
    """FedSeq Table 6: the setting, then each method's parameters, proxy, FLOPs and uploads."""
    st, methods = report["setting"], report["methods"]
    who = (
        f"{st['clients_counted']:g} expected participants a round"
        if st["participants"]
        else f"all {st['num_clients']} clients every round"
    )
    lines = [
        f"FedSeq Table 6: {who}, {st['local_steps']} batches of {st['batch_size']} a round "
        f"({st['samples_per_client']} samples, {st['local_epochs']} epoch(s)), "
        f"{st['rounds']} rounds; sub-layers "
        + " | ".join("+".join(g) for g in st["sublayers"])
        + f" unfreezing after rounds {st['unfreeze_rounds']}, head {'+'.join(st['head']) or '-'}",
    ]
    names = _counted(report)
    params = {n: " / ".join(f"{ph['params']:,}" for ph in methods[n]["phases"]) for n in names}
    w, p = _name_width(report), max(28, *(len(v) for v in params.values()))
    lines.append(
        f"{'method':<{w}} {'params trained per phase':<{p}} {'paper (params x batches)':>26} "
        f"{'measured FLOPs':>24}  {UPLOAD_HEADER}"
    )
    for name in names:
        m = methods[name]
        lines.append(
            f"{_label(name):<{w}} {params[name]:<{p}} {_billions(m['paper_flops']):>26} "
            f"{_billions(m['flops']):>24}  {m['upload_params']:>{len(UPLOAD_HEADER)},}"
        )
    return lines


def _measured_lines(report: dict[str, Any]) -> list[str]:
    """Each method's FLOPs and step memory a batch, phase by phase."""
    st, methods = report["setting"], report["methods"]
    lines = [f"measured FLOPs a batch of {st['batch_size']} (forward + backward):"]
    w = _name_width(report)
    for name in _counted(report):
        per = " / ".join(f"{ph['flops_batch']:,}" for ph in methods[name]["phases"])
        lines.append(
            f"  {_label(name):<{w}} {per}   ({_ratio(report, name, 'flops'):.3f}x FedAvg measured, "
            f"{_ratio(report, name, 'paper_flops'):.3f}x by the proxy)"
        )
    lines += ["", _memory_note(st)]
    for name in _counted(report):
        per = " / ".join(f"{ph['peak_mem']:,}" for ph in methods[name]["phases"])
        lines.append(f"  {_label(name):<{w}} {per}")
    return lines


def _memory_note(st: dict[str, Any]) -> str:
    copies = st["optimizer_state_copies"]
    state = f"{copies} cop{'y' if copies == 1 else 'ies'} of optimiser state" if copies else ""
    return (
        f"step memory, a batch of {st['batch_size']} (bytes: activations saved for backward + "
        f"gradients{' + ' + state if state else ''} of the trained parameters):"
    )


def comparison_sentence(report: dict[str, Any]) -> str:
    """One sentence on FedSeq anti against vanilla, measured and by the paper's proxy (none
    where the config cannot run them)."""
    if not {"fedseq-vanilla", "fedseq-anti"} <= report["methods"].keys():
        return ""
    va, aa = _ratio(report, "fedseq-vanilla", "flops"), _ratio(report, "fedseq-anti", "flops")
    vp = _ratio(report, "fedseq-vanilla", "paper_flops")
    ap = _ratio(report, "fedseq-anti", "paper_flops")
    if (aa < va) != (ap < vp):
        return (
            f"Measured, FedSeq anti costs {aa:.3f}x FedAvg and vanilla {va:.3f}x, reversing "
            f"the parameter proxy ({vp:.3f}x vanilla, {ap:.3f}x anti): a frozen shallow layer "
            "still needs the backward pass through all the layers above it, so training only "
            "the shallow layers saves little, while training only the deep ones skips the "
            "backward below them."
        )
    return (
        f"Measured, FedSeq anti costs {aa:.3f}x FedAvg and vanilla {va:.3f}x, in the proxy's "
        f"order ({vp:.3f}x vanilla, {ap:.3f}x anti)."
    )


def plot_cost(report: dict[str, Any], path: Path) -> None:
    """FedSeq Fig. 8: cumulative training cost by round, the paper's proxy and measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = report["setting"]["rounds"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in (
        (axes[0], "paper_flops", "paper proxy (params x batches)"),
        (axes[1], "flops", "measured (torch.utils.flop_counter)"),
    ):
        for name in report["methods"]:
            per_round = [0.0] * (rounds + 1)
            for ph in report["methods"][name]["phases"]:
                first, last = ph["rounds"]
                for t in range(first, last + 1):
                    per_round[t] += ph[key] / (last - first + 1)
            totals = [sum(per_round[: t + 1]) / 1e9 for t in range(rounds + 1)]
            ax.plot(range(rounds + 1), totals, label=_label(name))
        ax.set_xlim(0, rounds)
        ax.set_xlabel("round")
        ax.set_ylabel("cumulative FLOPs (billions)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_cost(args: Any) -> int:
    """``fedbug cost CONFIG [--json] [--participants] [--samples-per-client N] [--out DIR]``."""
    import json

    from fedbug.config import load_config

    cfg = load_config(args.config, getattr(args, "set", None) or [])
    report = cost_report(cfg, args.samples_per_client, args.participants)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cost.json").write_text(json.dumps(report, indent=1) + "\n")
        plot_cost(report, out / "cost.png")
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_cost_report(report))
        if args.out:
            print(f"written: {Path(args.out) / 'cost.png'}, {Path(args.out) / 'cost.json'}")
    return 0
