"""Training cost of freezing, computed from a config without loading any data.

Two tables, both from the config's model on its data set's input shape:

* FreezeFL Fig. 2 (``rows``): with the first n of the L units frozen (n = 0..L-1), the
  training FLOPs of a sample (forward + backward, counted with ``torch.utils.flop_counter``)
  and the upload bytes of units n+1..L, each over the same with nothing frozen.
* FedSeq Sec. 5.2 / Table 6 (``methods``): FedAvg, FedBABU, FedSeq vanilla and anti, FedROD.
  ``paper_flops`` is the paper's proxy, sum over rounds t of P(t) * B * E * N with P(t) the
  parameters trained in round t, B = ceil(samples_per_client / batch_size) batches, E local
  epochs and N clients (every client every round, as the paper counts; ``participants``: the
  expected r * N). ``flops`` multiplies the same way the FLOPs counted for one batch of each
  phase's trainable set: a frozen unit gets no weight gradient and autograd does no backward
  below the lowest trainable unit, so a frozen *shallow* unit still costs the backward through
  every unit above it. ``upload_params``: the parameters one client uploads over all rounds
  (with ``participants``, in the r share of rounds it is expected to join). A config's
  ``local_steps`` replaces B * E. FedROD trains the model and a personal head (a copy of the
  classifier on the detached features) and uploads the model only.

FedSeq's phases are computed here from the config's keys (``head_units``, ``sublayers``,
``rounds`` and, where set, ``unfreeze_rounds``) with the schedule's rule: in round t = 1..T the
sub-layers with t_k < t train, m(t) of them, vanilla 1..m(t) and anti K-m(t)+1..K; by default
t_k = floor((k-1)T/K). The fine-tuning rounds after T are not counted (nor does the paper).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedbug.errors import ConfigError
from fedbug.flops import LossFn, ce_loss, training_flops
from fedbug.layout import build_layout
from fedbug.models import build_model
from fedbug.units import ParamSpace, Unit, find_units, traced_module_order

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

METHODS = ("fedavg", "fedbabu", "fedseq-vanilla", "fedseq-anti", "fedrod")
LABELS = {
    "fedavg": "FedAvg",
    "fedbabu": "FedBABU",
    "fedseq-vanilla": "FedSeq vanilla",
    "fedseq-anti": "FedSeq anti",
    "fedrod": "FedROD",
}
PERSONAL_HEAD = "personal_head"
DEFAULT_SAMPLES_PER_CLIENT = 500


class PersonalHead(nn.Module):
    """The model with FedROD's personal head: a copy of its classifier on the same features.

    Output (generic logits, generic logits detached + personal logits), as in FedROD: the body
    and the generic head learn from the generic loss, the personal head from the sum's loss on
    detached features."""

    def __init__(self, model: nn.Module, classifier: str) -> None:
        super().__init__()
        self.model = model
        head = model.get_submodule(classifier)
        self.personal_head = copy.deepcopy(head)
        self._features: Tensor | None = None
        head.register_forward_pre_hook(self._capture)

    def _capture(self, _m: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        self._features = inputs[0]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        generic = self.model(x)
        assert self._features is not None
        personal = self.personal_head(self._features.detach())
        self._features = None
        return generic, generic.detach() + personal


def _fedrod_loss(output: tuple[Tensor, Tensor], y: Tensor) -> Tensor:
    return F.cross_entropy(output[0], y) + F.cross_entropy(output[1], y)


class FlopCache:
    """Per-batch FLOPs of a model by trainable unit set, counted once each."""

    def __init__(
        self, model: nn.Module, units: Sequence[Unit], x: Tensor, y: Tensor, loss_fn: LossFn
    ) -> None:
        self.model, self.units, self.x, self.y, self.loss_fn = model, units, x, y, loss_fn
        self._cache: dict[tuple[int, ...], int] = {}

    def __call__(self, trainable: Sequence[int]) -> int:
        key = tuple(sorted(trainable))
        if key not in self._cache:
            params = [p for u in key for p in self.units[u].params]
            self._cache[key] = training_flops(self.model, params, self.x, self.y, self.loss_fn)
        return self._cache[key]


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


def _example_batch(shape: tuple[int, ...], classes: int, kind: str, batch: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    if kind == "tokens":
        x = torch.randint(0, classes, (batch, *shape), generator=gen)
    else:
        x = torch.rand((batch, *shape), generator=gen)
    return x, torch.randint(0, classes, (batch,), generator=gen)


def _unfreeze_rounds(ts: Sequence[int] | None, k: int, rounds: int) -> tuple[int, ...]:
    if ts is None:
        return tuple((i - 1) * rounds // k for i in range(1, k + 1))
    ts = tuple(int(t) for t in ts)
    if len(ts) != k:
        raise ConfigError(
            f"unfreeze_rounds has {len(ts)} entries but the base has {k} sub-layers; give one "
            f"round per sub-layer, e.g. {[(i - 1) * rounds // k for i in range(1, k + 1)]}"
        )
    if ts[0] != 0:
        raise ConfigError(f"unfreeze_rounds must start at 0; got {list(ts)}")
    if any(b < a for a, b in zip(ts, ts[1:])):
        raise ConfigError(f"unfreeze_rounds must be non-decreasing; got {list(ts)}")
    if ts[-1] >= rounds:
        raise ConfigError(
            f"unfreeze_rounds {list(ts)}: the last sub-layer unfreezes after round {ts[-1]}, "
            f"but there are only {rounds} rounds; use values below {rounds}"
        )
    return ts


def schedule_phases(
    mode: str, sublayers: Sequence[Sequence[int]], unfreeze_rounds: Sequence[int], rounds: int
) -> list[tuple[int, int, tuple[int, ...]]]:
    """FedSeq's phases as (first round, last round, trained base units), rounds 1-based: in
    round t the m(t) = #{k : t_k < t} sub-layers 1..m (vanilla) or K-m+1..K (anti) train."""
    k = len(sublayers)
    phases: list[tuple[int, int, tuple[int, ...]]] = []
    for t in range(1, rounds + 1):
        m = sum(1 for tk in unfreeze_rounds if tk < t)
        groups = range(m) if mode == "vanilla" else range(k - m, k)
        units = tuple(sorted(u for g in groups for u in sublayers[g]))
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
    spc = getattr(cfg, "samples_per_client", None) or samples_per_client
    spc = DEFAULT_SAMPLES_PER_CLIENT if spc is None else int(spc)
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


def _cost_report(cfg: Any, samples_per_client: int | None, participants: bool) -> dict[str, Any]:
    s = _setting(cfg, samples_per_client, participants)
    _, _, kind = DATASET_SHAPES[cfg.dataset]
    model = build_model(cfg.model, s.input_shape, s.num_classes, cfg.seed, **cfg.model_options)
    x, y = _example_batch(s.input_shape, s.num_classes, kind, cfg.batch_size, cfg.seed)
    units = find_units(model, x[:1], names=cfg.units)
    space = ParamSpace(model, units)
    classifier = traced_module_order(model, x[:1])[-1]
    pcount = space.unit_param_numel
    count = FlopCache(model, units, x, y, ce_loss)
    L = len(units)

    full = count(range(L))
    rows = freeze_rows(units, space, count, cfg.batch_size)

    # FedSeq Table 6
    layout = build_layout(units, cfg.head_units, cfg.sublayers)
    ts = _unfreeze_rounds(getattr(cfg, "unfreeze_rounds", None), len(layout.sublayers), s.rounds)
    all_units = tuple(range(L))
    per_round = s.steps * s.clients  # batches trained a round, over all clients counted

    def method(
        phases: list[tuple[int, int, tuple[int, ...]]],
        counter: Callable[[Sequence[int]], int],
        names: Sequence[str],
        params: Sequence[int],
        uploaded: Callable[[tuple[int, ...]], Sequence[int]],
    ) -> dict[str, Any]:
        out = []
        for first, last, trained in phases:
            n_rounds = last - first + 1
            p = sum(params[u] for u in trained)
            up = sum(params[u] for u in uploaded(trained))
            fb = counter(trained)
            out.append(
                {
                    "rounds": [first, last],
                    "units": [names[u] for u in trained],
                    "params": p,
                    "upload_params": up,
                    "flops_batch": fb,
                    "paper_flops": _count(p * n_rounds * per_round),
                    "flops": _count(fb * n_rounds * per_round),
                }
            )
        share = s.clients / s.num_clients
        return {
            "paper_flops": sum(ph["paper_flops"] for ph in out),
            "flops": sum(ph["flops"] for ph in out),
            "upload_params": _count(
                share
                * sum(ph["upload_params"] * (ph["rounds"][1] - ph["rounds"][0] + 1) for ph in out)
            ),
            "phases": out,
        }

    names = [u.name for u in units]
    whole = [(1, s.rounds, all_units)]
    methods: dict[str, Any] = {
        "fedavg": method(whole, count, names, pcount, lambda t: t),
        "fedbabu": method([(1, s.rounds, layout.base)], count, names, pcount, lambda t: t),
    }
    for mode in ("vanilla", "anti"):
        phases = schedule_phases(mode, layout.sublayers, ts, s.rounds)
        methods[f"fedseq-{mode}"] = method(phases, count, names, pcount, lambda t: t)

    rod = PersonalHead(copy.deepcopy(model), classifier)
    # one unit per model unit (same order), then the personal head
    rod_units = [
        Unit(u.name, tuple(f"model.{m}" for m in u.modules), tuple(f"model.{p}" for p in u.params))
        for u in units
    ]
    rod_units.append(
        Unit(
            PERSONAL_HEAD,
            (PERSONAL_HEAD,),
            tuple(f"{PERSONAL_HEAD}.{n}" for n, _ in rod.personal_head.named_parameters()),
        )
    )
    rod_params = [*pcount, sum(p.numel() for p in rod.personal_head.parameters())]
    rod_count = FlopCache(rod, rod_units, x, y, _fedrod_loss)
    methods["fedrod"] = method(
        [(1, s.rounds, tuple(range(L + 1)))],
        rod_count,
        [*names, PERSONAL_HEAD],
        rod_params,
        lambda t: tuple(u for u in t if u < L),
    )

    setting = {
        "dataset": s.dataset,
        "model": s.model,
        "input_shape": list(s.input_shape),
        "num_classes": s.num_classes,
        "units": names,
        "head": [names[u] for u in layout.head],
        "sublayers": [[names[u] for u in g] for g in layout.sublayers],
        "unfreeze_rounds": list(ts),
        "rounds": s.rounds,
        "batch_size": s.batch_size,
        "samples_per_client": s.samples_per_client,
        "batches_per_epoch": s.batches,
        "local_epochs": s.local_epochs,
        "local_steps": s.steps,
        "num_clients": s.num_clients,
        "clients_counted": s.clients,
        "participants": s.participants,
        "params": sum(pcount),
        "flops_batch_full": full,
        "torch": torch.__version__,
    }
    return {"rows": rows, "methods": methods, "setting": setting}


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
        f"{'upload bytes':>14} {'comm':>6}",
    ]
    for r in report["rows"]:
        frozen = ", ".join(r["frozen"]) or "-"
        lines.append(
            f"{r['n_frozen']:>8}  {frozen:<28} {r['flops_sample']:>16,.0f} "
            f"{r['compute_ratio']:>8.3f} {r['upload_bytes']:>14,} {r['comm_ratio']:>6.3f}"
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
    for name in METHODS:
        m = methods[name]
        params = " / ".join(f"{ph['params']:,}" for ph in m["phases"])
        lines.append(
            f"{LABELS[name]:<15} {params:<28} {_billions(m['paper_flops']):>26} "
            f"{_billions(m['flops']):>24} {m['upload_params']:>21,}"
        )
    lines += ["", f"measured FLOPs a batch of {st['batch_size']} (forward + backward):"]
    for name in METHODS:
        m = methods[name]
        per = " / ".join(f"{ph['flops_batch']:,}" for ph in m["phases"])
        lines.append(
            f"  {LABELS[name]:<15} {per}   ({_ratio(report, name, 'flops'):.3f}x FedAvg measured, "
            f"{_ratio(report, name, 'paper_flops'):.3f}x by the proxy)"
        )
    lines += ["", comparison_sentence(report)]
    return "\n".join(lines)


def comparison_sentence(report: dict[str, Any]) -> str:
    """One sentence on FedSeq anti against vanilla, measured and by the paper's proxy."""
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
        for name in METHODS:
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
