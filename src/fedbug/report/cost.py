"""Training cost of freezing, computed from a config without loading any data.

Two tables, both from the config's model on its data set's input shape:

* FreezeFL Fig. 2 (``rows``): with the first n of the L units frozen (n = 0..L-1), the
  training FLOPs of a sample (forward + backward, counted with ``torch.utils.flop_counter``)
  and the upload bytes of units n+1..L, each over the same with nothing frozen; and a step's
  memory (``peak_mem``: activations saved for backward, gradients and the config optimiser's
  state for the trained parameters, :class:`~fedbug.core.flops.StepMemory`), as each method's
  phases (and ``peak_mem``, their largest) give it too.
* FedSeq Sec. 5.2 / Table 6 (``methods``): FedAvg, FedBABU, FedSeq vanilla and anti, FedROD.
  ``paper_flops`` is the paper's proxy, sum over rounds t of P(t) * B * E * N with P(t) the
  parameters trained in round t, B = ceil(samples_per_client / batch_size) batches, E local
  epochs and N clients (every client every round, as the paper counts; ``participants``: the
  expected r * N). ``flops`` multiplies the same way the FLOPs counted for one batch of each
  phase's trainable set: a frozen unit gets no weight gradient and autograd does no backward
  below the lowest trainable unit, so a frozen *shallow* unit still costs the backward through
  every unit above it. ``upload_params``: the parameters one client uploads over all rounds
  (with ``participants``, in the r share of rounds it is expected to join). A config's
  ``local_steps`` replaces B * E.

Each method is built as a run of it would be, by the real classes: its algorithm
(:func:`~fedbug.algorithms.build_algorithm`: the model it wraps, e.g. FedROD's personal head,
its loss on the example batch's labels, the units it allows and shares), and its units, layout
and FedSeq's schedule by the engine's own builder (:mod:`fedbug.engine.build`: ``units``,
``head_units``, ``sublayers``, ``rounds``, ``unfreeze_rounds``); a
phase is a run of rounds whose first local step trains the same units (every method here trains
the same units at every step of a round). The config's ``units`` name the model's submodules;
a method that wraps the model finds them under their new names. The fine-tuning rounds after T
are not counted (nor does the paper).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedbug.algorithms import ALGORITHMS, Algorithm, build_algorithm
from fedbug.algorithms.base import ClientSession
from fedbug.config import apply_method
from fedbug.core.flops import FlopCache, optimizer_state_copies
from fedbug.core.layout import Layout
from fedbug.core.protocol import ClientTask
from fedbug.core.tasks import TASKS, build_task
from fedbug.core.units import ParamSpace, Unit
from fedbug.data.targets import ONE_POSITION_FIX, next_tokens
from fedbug.engine.build import build_freezing, build_parts
from fedbug.engine.client import step_units
from fedbug.errors import ConfigError
from fedbug.models import build_model, model_kwargs
from fedbug.policies import StepCtx, build_policy
from fedbug.policies.schedule import RoundSchedule
from fedbug.system import freeze_rows

# name -> (input shape of one sample, number of classes, input kind); no data is loaded.
DATASET_SHAPES: dict[str, tuple[tuple[int, ...], int, str]] = {
    "digits": ((1, 8, 8), 10, "image"),
    "mnist": ((1, 28, 28), 10, "image"),
    "fashion_mnist": ((1, 28, 28), 10, "image"),
    "mnist_sample": ((1, 28, 28), 10, "image"),
    "femnist": ((1, 28, 28), 62, "image"),
    "cifar10": ((3, 32, 32), 10, "image"),
    "cifar100": ((3, 32, 32), 100, "image"),
    "cifar100_coarse": ((3, 32, 32), 20, "image"),
    "tiny_imagenet": ((3, 64, 64), 200, "image"),
    "shakespeare": ((80,), 80, "tokens"),
}

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

Phases = list[tuple[int, int, tuple[int, ...]]]


def _example_batch(
    shape: tuple[int, ...], classes: int, kind: str, batch: int, seed: int, targets: str = "last"
):
    """A batch of random inputs and labels; under ``targets: every`` a causal LM's targets at
    every position (the window shifted by one, then the sequence's own), as a run trains."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "tokens":
        x = torch.randint(0, classes, (batch, *shape), generator=gen)
    else:
        x = torch.rand((batch, *shape), generator=gen)
    y = torch.randint(0, classes, (batch,), generator=gen)
    if targets == "every" and kind == "tokens":
        y = next_tokens(x, y)
    return x, y


def refused(cfg: Any, method: str) -> str | None:
    """Why a run of ``method`` on this config would be refused (its algorithm's own check, on
    the config with that algorithm), or None: such a method is left out of the tables."""
    algorithm = apply_method({"method": method})["algorithm"]
    return ALGORITHMS.get(algorithm).check_config(cfg.model_copy(update={"algorithm": algorithm}))


def round_phases(units_of_round: Callable[[int], tuple[int, ...]], rounds: int) -> Phases:
    """Rounds 1..``rounds`` as phases (first round, last round, trained units): runs of
    consecutive rounds that train the same units."""
    phases: Phases = []
    for t in range(1, rounds + 1):
        units = units_of_round(t)
        if phases and phases[-1][2] == units:
            phases[-1] = (phases[-1][0], t, units)
        else:
            phases.append((t, t, units))
    return phases


@dataclass(frozen=True)
class Setting:
    dataset: str
    model: str
    input_shape: tuple[int, ...]
    num_classes: int
    rounds: int
    batch_size: int
    samples_per_client: int
    batches: int
    local_epochs: int
    steps: int
    num_clients: int
    clients: float
    participants: bool


def _setting(cfg: Any, samples_per_client: int | None, participants: bool) -> Setting:
    if cfg.dataset not in DATASET_SHAPES:
        raise ConfigError(
            f"fedbug cost has no input shape for data set {cfg.dataset!r}; known: "
            f"{', '.join(sorted(DATASET_SHAPES))}"
        )
    shape, classes, _ = DATASET_SHAPES[cfg.dataset]
    spc = DEFAULT_SAMPLES_PER_CLIENT if samples_per_client is None else int(samples_per_client)
    if spc < 1:
        raise ConfigError(f"samples_per_client must be at least 1; got {spc}")
    batches = math.ceil(spc / cfg.batch_size)
    steps = cfg.local_steps if cfg.local_steps else cfg.local_epochs * batches
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
        classes,
        cfg.rounds,
        cfg.batch_size,
        spc,
        batches,
        cfg.local_epochs,
        steps,
        cfg.num_clients,
        clients,
        participants,
    )


@dataclass
class Built:
    """One algorithm on the config's model: the (wrapped) model's units and layout, its client
    session on the example batch (its loss) and the FLOP counts of its trainable sets."""

    algorithm: Algorithm
    units: list[Unit]
    space: ParamSpace
    layout: Layout
    session: ClientSession
    flops: FlopCache


def _build(
    cfg: Any, name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, s: Setting
) -> Built:
    """Algorithm ``name`` on a copy of ``model``, built as a run of it builds it
    (:func:`~fedbug.engine.build.build_parts`), with its client session on the example batch."""
    task = build_task(cfg.task) if cfg.task in TASKS else None  # the run's loss (next_token)
    alg = build_algorithm(name, cfg.global_lr, {name: cfg.options(name)}, task)
    plain = cfg.model_copy(update={"algorithm": name, "policy": "none", "schedule": "none"})
    parts = build_parts(plain, alg, copy.deepcopy(model), x[:1])
    task = ClientTask(1, 0, cfg.seed, cfg.lr, s.samples_per_client, rounds=s.rounds)
    session = alg.start_client(task, y)
    flops = FlopCache(parts.template, session.loss)
    return Built(alg, parts.units, parts.space, parts.layout, session, flops)


def _phases(b: Built, schedule: RoundSchedule | None, s: Setting) -> Phases:
    """The units of each round's first local step, as a client of the method trains them."""
    policy = (schedule or build_policy("none")).start_client(b.session.task)

    def units_of_round(t: int) -> tuple[int, ...]:
        step = StepCtx(1, s.steps, b.layout.policy_units, t, 0, s.rounds)
        return tuple(sorted(step_units(policy, b.session, step, s.batches, b.layout.extra)))

    return round_phases(units_of_round, s.rounds)


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
    b: Built, phases: Phases, x: torch.Tensor, y: torch.Tensor, copies: int, per_round: int
) -> list[dict[str, Any]]:
    """Each phase of a method: the units it trains, their parameters (trained, uploaded), a
    batch's measured FLOPs and step memory, and its rounds' FLOPs measured and by the paper's
    proxy (parameters x batches)."""
    names = [u.name for u in b.units]
    params = b.space.unit_param_numel
    shared = b.algorithm.shared_mask(len(b.units))
    out = []
    for first, last, trained in phases:
        n_rounds = last - first + 1
        p = sum(params[u] for u in trained)
        step = b.flops.unit_cost(b.units, trained, x, y)
        out.append(
            {
                "rounds": [first, last],
                "units": [names[u] for u in trained],
                "params": p,
                "upload_params": sum(params[u] for u in trained if shared[u]),
                "flops_batch": step.flops,
                "paper_flops": _count(p * n_rounds * per_round),
                "flops": _count(step.flops * n_rounds * per_round),
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


def _cost_report(cfg: Any, samples_per_client: int | None, participants: bool) -> dict[str, Any]:
    s = _setting(cfg, samples_per_client, participants)
    _, _, kind = DATASET_SHAPES[cfg.dataset]
    model = build_model(cfg.model, s.input_shape, s.num_classes, cfg.seed, **model_kwargs(cfg))
    x, y = _example_batch(
        s.input_shape,
        s.num_classes,
        kind,
        cfg.batch_size,
        cfg.seed,
        getattr(cfg, "targets", "last"),
    )
    if y.dim() == 2:  # targets: every: the model must score every position
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            scores = model.eval()(x[:1])
        model.train()
        if scores.dim() != 3:
            raise ConfigError(
                f"model {cfg.model} gives one score row a sequence, {tuple(scores.shape)}, "
                f"for targets at each of its {y.shape[1]} positions ({ONE_POSITION_FIX})"
            )
    per_round = s.steps * s.clients  # batches trained a round, over all clients counted
    copies = optimizer_state_copies(cfg.optimizer, cfg.momentum)
    share = s.clients / s.num_clients

    builds: dict[str, Built] = {}
    methods: dict[str, Any] = {}
    schedules: list[RoundSchedule] = []
    left_out = {m: reason for m in METHODS if m != "fedavg" and (reason := refused(cfg, m))}
    for method in (m for m in METHODS if m not in left_out):
        doc = apply_method({"method": method})
        algorithm, mode = doc["algorithm"], doc.get("schedule", "none")
        if algorithm not in builds:
            builds[algorithm] = _build(cfg, algorithm, model, x, y, s)
        b = builds[algorithm]
        # the method's schedule alone: cost tables count no freeze policy of the config's
        _, schedule = build_freezing(
            cfg.model_copy(update={"policy": "none", "schedule": mode}), b.layout
        )
        if schedule is not None:
            schedules.append(schedule)
        out = _method_phases(b, _phases(b, schedule, s), x, y, copies, per_round)
        methods[method] = _method_totals(out, share)

    # Fig. 2 and the setting: FedAvg's model, the config's as it is
    plain = builds["fedavg"]
    units, layout = plain.units, plain.layout
    names = [u.name for u in units]
    rows = freeze_rows(
        units, plain.space, lambda trained: plain.flops.units(units, trained, x, y), s.batch_size
    )
    for r in rows:  # a step's memory with the first n frozen (counted with its FLOPs)
        step = plain.flops.unit_cost(units, range(r["n_frozen"], len(units)), x, y)
        r["peak_mem"] = step.memory(copies).total
    full = plain.flops.units(units, range(len(units)), x, y)
    setting = {
        "dataset": s.dataset,
        "model": s.model,
        "input_shape": list(s.input_shape),
        "num_classes": s.num_classes,
        "units": names,
        "head": [names[u] for u in layout.head],
        "sublayers": [[names[u] for u in g] for g in layout.sublayers],
        "unfreeze_rounds": list(schedules[0].unfreeze_rounds) if schedules else [],
        "rounds": s.rounds,
        "batch_size": s.batch_size,
        "samples_per_client": s.samples_per_client,
        "batches_per_epoch": s.batches,
        "local_epochs": s.local_epochs,
        "local_steps": s.steps,
        "num_clients": s.num_clients,
        "clients_counted": s.clients,
        "participants": s.participants,
        "params": sum(plain.space.unit_param_numel),
        "flops_batch_full": full,
        "optimizer_state_copies": copies,
        "torch": torch.__version__,
    }
    return {"rows": rows, "methods": methods, "setting": setting, "left_out": left_out}


def _billions(flops: int) -> str:
    return f"{flops / 1e9:,.3f} billion"


def _ratio(report: dict[str, Any], name: str, key: str) -> float:
    m = report["methods"]
    return m[name][key] / m["fedavg"][key]


def format_cost_report(report: dict[str, Any]) -> str:
    """The two tables and the proxy-versus-measured comparison, as text."""
    st, methods = report["setting"], report["methods"]
    who = (
        f"{st['clients_counted']:g} expected participants a round"
        if st["participants"]
        else f"all {st['num_clients']} clients every round"
    )
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
    lines += [
        "",
        f"FedSeq Table 6: {who}, {st['local_steps']} batches of {st['batch_size']} a round "
        f"({st['samples_per_client']} samples, {st['local_epochs']} epoch(s)), "
        f"{st['rounds']} rounds; sub-layers "
        + " | ".join("+".join(g) for g in st["sublayers"])
        + f" unfreezing after rounds {st['unfreeze_rounds']}, head {'+'.join(st['head'])}",
        f"{'method':<15} {'params trained per phase':<28} {'paper (params x batches)':>26} "
        f"{'measured FLOPs':>24} {'upload params/client':>21}",
    ]
    for name in (n for n in METHODS if n in methods):
        m = methods[name]
        params = " / ".join(f"{ph['params']:,}" for ph in m["phases"])
        lines.append(
            f"{LABELS[name]:<15} {params:<28} {_billions(m['paper_flops']):>26} "
            f"{_billions(m['flops']):>24} {m['upload_params']:>21,}"
        )
    lines += ["", f"measured FLOPs a batch of {st['batch_size']} (forward + backward):"]
    for name in (n for n in METHODS if n in methods):
        m = methods[name]
        per = " / ".join(f"{ph['flops_batch']:,}" for ph in m["phases"])
        lines.append(
            f"  {LABELS[name]:<15} {per}   ({_ratio(report, name, 'flops'):.3f}x FedAvg measured, "
            f"{_ratio(report, name, 'paper_flops'):.3f}x by the proxy)"
        )
    lines += ["", _memory_note(st)]
    for name in (n for n in METHODS if n in methods):
        per = " / ".join(f"{ph['peak_mem']:,}" for ph in methods[name]["phases"])
        lines.append(f"  {LABELS[name]:<15} {per}")
    lines += ["", comparison_sentence(report)]
    for name, reason in report.get("left_out", {}).items():
        lines.append(f"not counted: {LABELS[name]}, which this config cannot run ({reason})")
    return "\n".join(lines)


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
        for name in (n for n in METHODS if n in report["methods"]):
            xs, ys, total = [0], [0.0], 0.0
            for ph in report["methods"][name]["phases"]:
                first, last = ph["rounds"]
                per = ph[key] / (last - first + 1)
                for t in range(first, last + 1):
                    total += per
                    xs.append(t)
                    ys.append(total / 1e9)
            ax.plot(xs, ys, label=LABELS[name])
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
