"""FL-bench (KarhouTam/FL-bench) driven on a scenario: its own server and client classes, unchanged.

The harness runs FL-bench as ``python main.py method=<m> <overrides>`` does: the checkout's
``config/defaults.yaml`` composed with the overrides by hydra (:func:`overrides` lists them,
e.g. ``method=fedprox fedprox.mu=0.01 common.local_epoch=25 optimizer.lr=0.1``), then the
checkout's own ``main.main`` (called with that config, as hydra calls it): its ``parse_args``, the
pruning of unused config groups, ``<Method>Server(args=config)`` and ``run_experiment()``, whose
``train()`` loop (select, send, train, receive, aggregate; the clients' evaluation and, at
``test.client.interval``, fine-tuning) runs as written, serially (``mode: serial``, one client
worker).

What is replaced, each the least that lets the comparison run (RESULTS.md lists them):

1. Missing modules: ``torchvision`` (no build loads beside torch 2.13 CPU here): the stand-in of
   :mod:`shims` (``transforms.Compose``), plus the names ``torchvision.models.*`` and
   ``torchvision.io.image`` are read at import (``utils/models.py`` builds class-level tables of
   ``models.resnet50, models.ResNet50_Weights.DEFAULT, ...``; ``data/utils/datasets.py`` imports
   ``read_image``): placeholders that fail if called. ``pynvml`` (imported at module level by
   ``utils/functional.py``, used only with CUDA): an empty module. ``omegaconf`` and
   ``hydra-core`` are the real packages (not installed in fedbug's venv: ``--deps`` names a
   folder they were installed into with ``pip install --target``); ``ray`` and ``rich`` are
   installed (``ray`` is not used in serial mode).
2. Data: the data set is the stand-in :class:`ScenarioData` (a subclass of FL-bench's own
   ``BaseDataset``: its ``__getitem__``, ``train``/``eval`` transforms unchanged) registered as
   ``DATASETS["equivalence"]``, holding the scenario's clients' samples one after the other; its
   ``_rescale_data`` (divide by 255 when the max exceeds 1, for 0-255 pixel data) does nothing,
   since the inputs are already standardized floats. The partition (``partition.pkl``) and
   ``args.json`` that ``generate_data.py`` would write are written to a temporary folder, which
   ``src.server.fedavg.FLBENCH_ROOT`` points to while the run lasts (the checkout is not
   written to). ``split: sample``, every client in train/val/test, no validation samples.
3. Model: ``MODELS["equivalence"]`` builds fedbug's model (smooth twin included) split as FL-bench
   models are (``DecoupledModel``: ``base`` = the model with its classifier replaced by
   ``Identity``, ``classifier`` = fedbug's last layer, as PFLlib's ``BaseHeadSplit``), so its
   parameters are fedbug's, in fedbug's order (shapes checked).
4. Batch order: the client worker's ``trainloader`` (a ``DataLoader(shuffle=True)``) becomes the
   PFLlib harness's replay loader: one permutation an epoch drawn from fedbug's generator for
   (seed, "client", round, client), as ``fedbug.engine.client.train_client`` draws it (fine-tuning:
   round 0); ``default_collate``, nothing dropped (FL-bench's loader keeps a last partial batch
   and its loops skip a batch of one sample).
5. Selection: ``client_sample_stream`` (FL-bench's per-round draws, made with ``random.sample``
   at start-up) becomes fedbug's draw of each round, in fedbug's order.
6. Device and output: ``common.use_cuda=false``; ``save_log``, ``save_learning_curve_plot``,
   ``save_metrics`` off (optional loggers; ``monitor`` stays null) and hydra's output folder a
   temporary one (``HydraConfig`` set from a composed config, as ``hydra.main`` sets it); the
   printing is captured.

The weights are read by wrapping (not changing) ``server.aggregate_client_updates`` (the global
parameters after each round) and the worker's ``train`` and ``finetune`` (each client's model
after its local training or fine-tuning), and the worker optimizer's ``step`` is counted.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import io
import json
import pickle
import sys
import tempfile
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.equivalence import shims
from benchmarks.equivalence.reference_pfllib import _Loaders, _ReplayLoader

# fedbug algorithm -> FL-bench method (the file name under src/server)
METHOD = {
    "fedavg": "fedavg",
    "fedprox": "fedprox",
    "feddyn": "feddyn",
    "scaffold": "scaffold",
    "fedper": "fedper",
    "lg_fedavg": "lgfedavg",
    "fedrep": "fedrep",
    "fedrod": "fedrod",
    "fedbabu": "fedbabu",
}
DATASET = "equivalence"


@dataclass
class FlbenchInput:
    """What FL-bench is given: the method, its config overrides, the data, fedbug's model and
    per-round participants (fedbug's draws)."""

    method: str  # FL-bench's method name
    overrides: list[str]
    train: list[tuple[torch.Tensor, torch.Tensor]]  # per client
    test: list[tuple[torch.Tensor, torch.Tensor]]  # per client (may be empty)
    num_classes: int
    model: nn.Module  # fedbug's model with the initial weights
    classifier: str  # the name of its last layer
    participants: list[list[int]]
    seed: int = 0  # fedbug's run seed: its batch order


@dataclass
class ReferenceRun:
    overrides: list[str]
    names: list[str] = field(default_factory=list)  # the server's global parameters
    client_names: list[str] = field(default_factory=list)  # a client model's parameters
    rounds: list[list[torch.Tensor]] = field(default_factory=list)  # [round] global params
    clients: list[dict[int, list[torch.Tensor]]] = field(default_factory=list)  # trained ones
    finetuned: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # [client]
    batches: dict[tuple[int, int], int] = field(default_factory=dict)  # (round, client): yielded
    steps: dict[tuple[int, int], int] = field(default_factory=dict)  # optimizer steps taken
    log: str = ""


class _Unavailable:
    """A torchvision name FL-bench reads at import but the harness never uses."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Unavailable:
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"torchvision.{self._name} is not in the harness's stand-in")


def _install_stand_ins() -> None:
    shims.install_torchvision()
    tv_models = sys.modules["torchvision.models"]
    tv_models.__getattr__ = lambda name: _Unavailable(f"models.{name}")  # type: ignore[attr-defined]
    io_mod = types.ModuleType("torchvision.io")
    image = types.ModuleType("torchvision.io.image")
    image.ImageReadMode = _Unavailable("io.image.ImageReadMode")  # type: ignore[attr-defined]
    image.read_image = _Unavailable("io.image.read_image")  # type: ignore[attr-defined]
    io_mod.image = image  # type: ignore[attr-defined]
    sys.modules["torchvision"].io = io_mod  # type: ignore[attr-defined]
    sys.modules.update({"torchvision.io": io_mod, "torchvision.io.image": image})
    if importlib.util.find_spec("pynvml") is None:
        nvml = types.ModuleType("pynvml")
        nvml.__doc__ = "fedbug equivalence harness stand-in: CUDA is never used"
        sys.modules["pynvml"] = nvml


_loaded: dict[str, Any] = {}


def load(path: str | Path, deps: str | Path | None = None) -> dict[str, Any]:
    """Import the checkout's modules once (with the stand-ins); ``deps``: a folder holding
    omegaconf and hydra-core (``pip install --target``)."""
    root = Path(path).resolve()
    if _loaded.get("path") == str(root):
        return _loaded
    if _loaded:
        raise RuntimeError("one reference checkout per process")
    if not (root / "src" / "server" / "fedavg.py").is_file() or not (root / "main.py").is_file():
        raise SystemExit(f"{path}: not a checkout of KarhouTam/FL-bench (no src/server/fedavg.py)")
    if deps is not None:
        sys.path.append(str(Path(deps).resolve()))
    for mod in ("omegaconf", "hydra"):
        if importlib.util.find_spec(mod) is None:
            raise SystemExit(
                f"FL-bench needs {mod}: pip install --target /tmp/flbench-deps "
                "omegaconf==2.3.0 hydra-core==1.3.2 antlr4-python3-runtime==4.9.3, "
                "then pass --deps /tmp/flbench-deps"
            )
    _install_stand_ins()
    sys.path.insert(0, str(root))
    for name in ("src", "data"):  # the checkout's packages, not another project's
        if name in sys.modules:
            raise RuntimeError(f"a module named {name!r} is already imported")
    mods: dict[str, Any] = {
        "fedavg": importlib.import_module("src.server.fedavg"),
        "models": importlib.import_module("src.utils.models"),
        "datasets": importlib.import_module("data.utils.datasets"),
    }
    for method in METHOD.values():
        mods[f"server.{method}"] = importlib.import_module(f"src.server.{method}")
    spec = importlib.util.spec_from_file_location("flbench_main", root / "main.py")
    assert spec is not None and spec.loader is not None
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)
    mods["main"] = main
    _loaded.update(mods, path=str(root))
    return _loaded


def _dataset_class(base: type) -> type:
    class ScenarioData(base):  # type: ignore[misc, valid-type]
        """FL-bench's ``BaseDataset`` over the scenario's samples (``STORE`` set per run)."""

        STORE: dict[str, Any] = {}

        def __init__(self, root: Any, args: Any = None, **transforms: Any) -> None:
            st = ScenarioData.STORE
            super().__init__(data=st["x"], targets=st["y"], classes=st["classes"], **transforms)

        def _rescale_data(self) -> None:  # the inputs are standardized floats already
            pass

    return ScenarioData


def _decoupled(m: dict[str, Any], model: nn.Module, classifier: str) -> nn.Module:
    """fedbug's model as an FL-bench ``DecoupledModel``: base = the model with its classifier
    replaced by Identity, classifier = that layer (parameter order unchanged: it is last)."""
    base = copy.deepcopy(model)
    head = copy.deepcopy(base.get_submodule(classifier))
    parent, _, leaf = classifier.rpartition(".")
    setattr(base.get_submodule(parent) if parent else base, leaf, nn.Identity())
    out = m["models"].DecoupledModel()
    out.base, out.classifier = base, head
    src = list(model.named_parameters())
    dst = list(out.named_parameters())
    if [tuple(p.shape) for _, p in src] != [tuple(p.shape) for _, p in dst]:
        raise RuntimeError("fedbug's and FL-bench's parameters differ in order or shape")
    return out


def run(path: str | Path, inp: FlbenchInput, deps: str | Path | None = None) -> ReferenceRun:
    """FL-bench's global parameters after each round (and each trained client's model, each
    fine-tuned one) for ``inp``."""
    m = load(path, deps)
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    out = ReferenceRun(overrides=list(inp.overrides))
    rounds = len(inp.participants)
    x = torch.cat([a for a, _ in inp.train] + [a for a, _ in inp.test])
    y = torch.cat([b for _, b in inp.train] + [b for _, b in inp.test])
    indices, at = [], 0
    for a, _ in inp.train:
        indices.append({"train": list(range(at, at + len(a))), "val": []})
        at += len(a)
    for i, (a, _) in enumerate(inp.test):
        indices[i]["test"] = list(range(at, at + len(a)))
        at += len(a)
    for d in indices:
        d.setdefault("test", [])
    n = len(inp.train)
    partition = {
        "separation": {
            "train": list(range(n)),
            "val": list(range(n)),
            "test": list(range(n)),
            "total": n,
        },  # fmt: skip
        "data_indices": indices,
    }
    data_cls = _dataset_class(m["datasets"].BaseDataset)
    data_cls.STORE.update(x=x, y=y, classes=list(range(inp.num_classes)))
    m["datasets"].DATASETS[DATASET] = data_cls
    m["models"].MODELS[DATASET] = lambda dataset, pretrained: _decoupled(
        m, inp.model, inp.classifier
    )
    server_mod = m[f"server.{inp.method}"]
    cls = next(v for k, v in vars(server_mod).items() if k.lower() == inp.method + "server")
    loaders = _Loaders(types.SimpleNamespace(seed=inp.seed), out.batches)  # type: ignore[arg-type]
    had_train = "train" in cls.__dict__
    orig_train = cls.train

    def train(self: Any) -> None:  # instrument the server built by main.main, then train
        _instrument(self, inp, loaders, out)
        return orig_train(self)

    log = io.StringIO()
    fedavg = m["fedavg"]
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data" / DATASET
        data_dir.mkdir(parents=True)
        (data_dir / "partition.pkl").write_bytes(pickle.dumps(partition))
        (data_dir / "args.json").write_text(
            json.dumps({"client_num": n, "split": "sample", "val_ratio": 0.0})
        )
        conf_dir = str(Path(m["path"]) / "config")
        with initialize_config_dir(config_dir=conf_dir, version_base=None):
            config = compose("defaults", overrides=inp.overrides)
            hydra_cfg = compose("defaults", overrides=inp.overrides, return_hydra_config=True)
        with open_dict(hydra_cfg):
            hydra_cfg.hydra.runtime.output_dir = str(Path(tmp) / "out")
        HydraConfig.instance().set_config(hydra_cfg)
        root, fedavg.FLBENCH_ROOT = fedavg.FLBENCH_ROOT, Path(tmp)
        cls.train = train
        try:
            with contextlib.redirect_stdout(log), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m["main"].main(config)
        finally:
            fedavg.FLBENCH_ROOT = root
            if had_train:
                cls.train = orig_train
            else:
                del cls.train
            HydraConfig.instance().cfg = None
    out.log = log.getvalue()
    if len(out.rounds) != rounds:
        raise RuntimeError(f"FL-bench ran {len(out.rounds)} rounds, not {rounds}")
    return out


def overrides_common(
    rounds: int, local_epoch: int, batch_size: int, lr: float, wd: float
) -> list[str]:
    """The overrides every case shares (the rest of ``config/defaults.yaml`` as it is)."""
    return [
        f"dataset.name={DATASET}", f"model.name={DATASET}",
        "model.use_torchvision_pretrained_weights=false",
        f"common.global_epoch={rounds}", f"common.local_epoch={local_epoch}",
        f"common.batch_size={batch_size}", "common.join_ratio=1",
        f"optimizer.lr={lr}", f"optimizer.weight_decay={wd}",
        "common.use_cuda=false", "common.save_log=false",
        "common.save_learning_curve_plot=false", "common.save_metrics=false",
    ]  # fmt: skip


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _instrument(server: Any, inp: FlbenchInput, loaders: _Loaders, out: ReferenceRun) -> None:
    """Wrap (not change) what the harness needs to see; replay fedbug's draws and batch order."""
    if len(server.client_sample_stream) != len(inp.participants):
        raise RuntimeError("FL-bench's round count differs from the scenario's")
    server.client_sample_stream = [list(p) for p in inp.participants]
    worker = server.trainer.worker
    batch = server.args.common.batch_size
    worker.trainloader = _ReplayLoader(worker.trainset, batch, False, loaders)
    train, finetune, aggregate = worker.train, worker.finetune, server.aggregate_client_updates
    step = worker.optimizer.step  # one optimizer for every client (its state reloaded)
    out.client_names = [n for n, _ in worker.model.named_parameters()]
    trained: dict[int, list[torch.Tensor]] = {}

    def wrapped_train(package: dict[str, Any]) -> Any:
        with loaders.training(server.current_epoch + 1, package["client_id"]):
            res = train(package)
        trained[package["client_id"]] = _params(worker.model)
        return res

    def wrapped_finetune() -> Any:
        with loaders.training(0, worker.client_id):  # fedbug's FINETUNE_ROUND
            res = finetune()
        out.finetuned[worker.client_id] = _params(worker.model)
        return res

    def aggregate_client_updates(packages: Any) -> Any:
        res = aggregate(packages)
        out.names = list(server.public_model_params)
        out.rounds.append([p.detach().clone() for p in server.public_model_params.values()])
        out.clients.append(dict(trained))
        trained.clear()
        return res

    def counted_step(*args: Any, **kwargs: Any) -> Any:
        out.steps[loaders.at] = out.steps.get(loaders.at, 0) + 1
        return step(*args, **kwargs)

    worker.train, worker.finetune = wrapped_train, wrapped_finetune
    worker.optimizer.step = counted_step
    server.aggregate_client_updates = aggregate_client_updates
