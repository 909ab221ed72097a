"""The FedBug authors' code (IandRover/FedBug, built on alpemreacar/FedDyn), driven on a scenario.

The harness imports the checkout's own modules (``utils_methods``, ``utils_general``,
``utils_gu``, ``utils_models``) and calls its round loop ``utils_methods.train`` unchanged, with:

* ``args`` built here as ``wk_run.py`` builds them (``--mode``, ``--epoch``, ``--gu_ratio``,
  ``--gu_unit``, batch size, weight decay 1e-3, FedDyn's ``alpha_coef``, FedProx's ``mu``,
  SCAFFOLD's ``n_minibatch`` = epochs x ceil(mean client size / batch)), device = CPU,
  participation ``act_prob = 1`` (every client every round);
* a ``data_obj`` holding the scenario's clients as ``DatasetObject`` does (float32 N x 3 x 32 x
  32 arrays, labels N x 1);
* ``init_model`` holding fedbug's initial weights, copied by parameter order.

What is replaced, each the least that lets the comparison run (RESULTS.md lists them):

1. ``torchvision``: the stand-in of :mod:`shims`.
2. Batch order: ``utils_general.data`` (its ``torch.utils.data``) is handed a ``DataLoader`` that
   replays fedbug's order: client i in round r draws one permutation an epoch from fedbug's
   generator for (seed, "client", r, i), as ``fedbug.engine.client.train_client`` does, and the
   loader
   yields the reference's own ``Dataset`` items in that order, collated by torch's
   ``default_collate``. With full batches the order only decides float summation order, but
   at lr 0.1 the local dynamics amplify one rounding difference (a ReLU or max-pool near a tie)
   to 1e-3 of the update within a round; replayed, both sides add in the same order.
3. Augmentation off: ``utils_general.Dataset`` (the name the training loops call) becomes a
   subclass that passes ``train=False``, so ``__getitem__`` skips its random flip and crop; the
   image path (``np.moveaxis`` + ``ToTensor``) is unchanged.
4. SCAFFOLD's call: ``utils_methods.train`` calls ``train_scaffold_mdl`` with 7 arguments but
   the function takes 9 (``learning_rate, batch_size, n_minibatch``), so as published SCAFFOLD
   stops with a TypeError in round 1. The adapter passes ``args.lr, args.bs, n_minibatch``
   (the two extra values are unused in the function body). Applied only when the signature
   still mismatches.
5. ResNet-18 normalisation: ``utils_models.resnet18`` keeps torchvision's BatchNorm (only
   ``resnet34`` is passed through ``replace_batchnorm``), and then ``utils_methods.train``
   stops at once: ``load_state_dict(dict(init_model.named_parameters()))`` is strict and lacks
   the BatchNorm running statistics. With ``norm="gn"`` (default) the harness applies the
   reference's own ``replace_batchnorm`` (GroupNorm(2, C)) to the ResNet-18 it builds, as the
   FedBug paper describes and as the code does for ResNet-34; ``norm="bn"`` runs it as written.
6. The smooth twin (``Scenario.smooth``, see :mod:`scenario`): the same module swap as on
   fedbug's side, and ``utils_models.F`` (the CNN's forward calls ``F.relu``) with tanh as relu.

The global weights after every round are read by wrapping ``utils_methods.set_client_from_params``:
the last call in round i (``args.global_epoch``) builds the model the server sends next (FedDyn:
``cld_model``; the others: ``avg_model``).
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from benchmarks.equivalence import shims
from benchmarks.equivalence.scenario import Scenario, build_model, client_data, smooth_twin
from fedbug.core.seeding import torch_generator

MODES = ("fedavg", "fedprox", "feddyn", "fedexp", "scaffold")
GU_UNIT = {"standard_cnn": "L", "stage": "M", "block": "B"}
TASK = {10: "CIFAR10", 100: "CIFAR100"}


@dataclass
class ReferenceRun:
    names: list[str]  # the reference's parameter names, in its order
    rounds: list[dict[str, torch.Tensor]] = field(default_factory=list)
    adapters: list[str] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)  # before clipping, every local step


_loaded: dict[str, Any] = {}


def commit_of(path: str | Path) -> str:
    """The checkout's commit (``git rev-parse HEAD``), or 'unknown' outside a git work tree."""
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def load(path: str | Path) -> dict[str, Any]:
    """Import the checkout's modules once (with the torchvision stand-in)."""
    path = str(Path(path).resolve())
    if _loaded.get("path") == path:
        return _loaded
    if _loaded:
        raise RuntimeError("one reference checkout per process")
    if not (Path(path) / "utils_methods.py").is_file():
        raise SystemExit(f"{path}: not a checkout of IandRover/FedBug (no utils_methods.py)")
    shims.install_torchvision()
    sys.path.insert(0, path)
    mods = {
        n: importlib.import_module(n)
        for n in ("utils_dataset", "utils_models", "utils_gu", "utils_general", "utils_methods")
    }
    _loaded.update(mods, path=path)
    return _loaded


def _no_augment(ref_dataset: type) -> type:
    class NoAugment(ref_dataset):  # type: ignore[misc, valid-type]
        def __init__(self, data_x, data_y=True, train=False, dataset_name=""):
            super().__init__(data_x, data_y, train=False, dataset_name=dataset_name)

    return NoAugment


class _SmoothF:
    """``torch.nn.functional`` with ``relu`` as tanh (the reference CNN's smooth twin)."""

    relu = staticmethod(torch.tanh)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.nn.functional, name)


class _ReplayData:
    """A stand-in for the ``torch.utils.data`` module the reference's training loops see: its
    ``DataLoader(dataset, batch_size, shuffle=True)`` replays the next client's permutations."""

    Dataset = torch.utils.data.Dataset

    def __init__(self, orders: list[list[torch.Tensor]]) -> None:
        self.orders = list(orders)  # one entry per (round, client) in training order

    def DataLoader(self, dataset, batch_size, shuffle=False):  # noqa: N802 (torch's name)
        if not shuffle:
            return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)
        return _ReplayLoader(dataset, batch_size, self.orders.pop(0))


class _ReplayLoader:
    def __init__(self, dataset, batch_size: int, perms: list[torch.Tensor]) -> None:
        self.dataset, self.batch_size, self.perms = dataset, batch_size, list(perms)

    def __iter__(self):
        perm = self.perms.pop(0)
        for start in range(0, len(perm), self.batch_size):
            idx = perm[start : start + self.batch_size].tolist()
            yield torch.utils.data.default_collate([self.dataset[i] for i in idx])


def fedbug_orders(s: Scenario) -> list[list[torch.Tensor]]:
    """fedbug's per-epoch permutations, per (round, client) in training order."""
    out = []
    for r in range(1, s.rounds + 1):
        for i in range(s.clients):
            gen = torch_generator(0, "client", r, i)
            out.append([torch.randperm(s.samples, generator=gen) for _ in range(s.local_steps)])
    return out


def _args(s: Scenario, savepath: str) -> SimpleNamespace:
    if s.algorithm not in MODES:
        raise ValueError(f"the FedBug reference has no {s.algorithm!r}; it has {MODES}")
    if s.num_classes not in TASK:
        raise ValueError("the reference's CIFAR models have 10 or 100 classes")
    args = SimpleNamespace(
        mode=s.algorithm,
        epoch=s.local_steps,  # one full batch per epoch: K local steps
        model_name="cnn" if s.model == "standard_cnn" else s.model,
        task=TASK[s.num_classes],
        n_clients=s.clients,
        act_prob=1.0,
        lr=s.lr,
        momentum=0,
        gu_ratio=s.gu_ratio if s.gu_ratio else 0,
        gu_unit=GU_UNIT["standard_cnn" if s.model == "standard_cnn" else s.units],
        device=torch.device("cpu"),
        seed=1,
        com_amount=s.rounds,
        bs=s.samples,
        weight_decay=s.weight_decay,
        savepath=savepath,
        savename=f"{savepath}/s1.csv",
        extension="",
    )
    if s.algorithm == "feddyn":
        args.alpha_coef = s.params.get("alpha", 1e-2)  # wk_run.py: 1e-2
    elif s.algorithm == "fedprox":
        args.mu = s.params.get("mu", 1e-4)  # wk_run.py: 1e-4
    elif s.algorithm == "scaffold":
        # wk_run.py: epoch * ceil(mean client size / bs); one full batch an epoch here
        args.n_minibatch = np.int64(args.epoch * int(np.ceil(s.samples / args.bs)))
    return args


def run(path: str | Path, s: Scenario, norm: str = "gn", replay: bool = True) -> ReferenceRun:
    """The reference's global weights after each round of the scenario."""
    if s.rounds >= 10:
        raise ValueError("rounds must be below 10 (round 10 evaluates and rebuilds all_model)")
    m = load(path)
    methods, general, models = m["utils_methods"], m["utils_general"], m["utils_models"]
    out = ReferenceRun(names=[])
    general.Dataset = _no_augment(m["utils_dataset"].Dataset)
    general.max_norm = s.clip
    general.data = _ReplayData(fedbug_orders(s)) if replay else torch.utils.data
    scaffold_fn = general.train_scaffold_mdl
    if len(inspect.signature(scaffold_fn).parameters) == 9:

        def scaffold_adapter(args, model, model_func, diff, trn_x, trn_y, n_minibatch):
            return scaffold_fn(args, model, model_func, diff, trn_x, trn_y, args.lr, args.bs,
                               n_minibatch)  # fmt: skip

        methods.train_scaffold_mdl = scaffold_adapter
        if s.algorithm == "scaffold":
            out.adapters.append("scaffold call signature")
    else:
        methods.train_scaffold_mdl = scaffold_fn

    with tempfile.TemporaryDirectory() as tmp:
        args = _args(s, tmp)

        def model_func():
            model = models.client_model(args.task.lower(), args)
            if s.model == "resnet18" and norm == "gn":
                model.model = models.replace_batchnorm(model.model)
            return smooth_twin(model) if s.smooth else model

        # the CIFAR CNN calls F.relu in forward: its smooth twin sees tanh there
        models.F = _SmoothF() if s.smooth else torch.nn.functional

        init_model = model_func()
        src = list(build_model(s).parameters())
        dst = list(init_model.named_parameters())
        if len(src) != len(dst):
            raise RuntimeError(f"parameter counts differ: fedbug {len(src)}, ref {len(dst)}")
        with torch.no_grad():
            for p, (name, q) in zip(src, dst):
                if p.shape != q.shape:
                    raise RuntimeError(f"{name}: reference {tuple(q.shape)} vs {tuple(p.shape)}")
                q.copy_(p)
        out.names = [n for n, _ in dst]
        data = client_data(s)
        data_obj = SimpleNamespace(
            n_client=s.clients,
            clnt_x=[x.numpy().astype(np.float32) for x, _ in data],
            clnt_y=[y.numpy().reshape(-1, 1).astype(np.float32) for _, y in data],
            tst_x=data[0][0][:4].numpy(),
            tst_y=data[0][1][:4].numpy().reshape(-1, 1).astype(np.float32),
        )
        original = methods.set_client_from_params
        captured: dict[int, dict[str, torch.Tensor]] = {}

        def capture(a, mdl, params):
            model = original(a, mdl, params)
            captured[a.global_epoch] = {n: p.detach().clone() for n, p in model.named_parameters()}
            return model

        clip_fn = torch.nn.utils.clip_grad_norm_

        def clip_and_record(*a, **k):  # what the reference's clipping saw, to report
            norm = clip_fn(*a, **k)
            out.grad_norms.append(float(norm))
            return norm

        methods.set_client_from_params = capture
        torch.nn.utils.clip_grad_norm_ = clip_and_record
        try:
            methods.train(args=args, data_obj=data_obj, model_func=model_func,
                          init_model=init_model)  # fmt: skip
        finally:
            methods.set_client_from_params = original
            torch.nn.utils.clip_grad_norm_ = clip_fn
    out.rounds = [captured[i] for i in range(s.rounds)]
    return out
