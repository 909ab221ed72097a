"""FedPart's authors' code (FLAIR-Community/Fling), driven on the Fling pair's cases.

The harness imports the checkout's own modules (it is put on ``sys.path``) and calls:

* for a ``schedule`` case, ``fling.pipeline.partial_model_pipeline.get_train_args(rnd,
  model_name)`` for every round (faebd06), or the first version's ``get_train_args_*_v1`` and
  ``get_kwds`` (4464a46, loaded from that checkout's ``partial_model_pipeline.py``). Its
  commented FedPart(Base) variant (5 warm-up rounds, then ``get_kwds(rnd - 5, rnd2str)``) is
  run as that comment reads, on the group table its Repeat function uses; its orders other than
  ``roll`` (``roll+back``, ``V``) by the function's own source with the hard-coded ``func =
  'roll'`` set to them. A round where the code stops (an UnboundLocalError past its last cycle)
  is recorded as None.
* for a ``train`` case, the pipeline's round as ``partial_model_pipeline`` runs it, for the
  case's round indices in order (every round from 0 on, or one round from the initial weights):
  ``get_train_args`` / ``get_aggr_args``, the ``serial`` launcher's ``train`` of every
  ``BaseClient``, ``ParameterServerGroup.aggregate`` (``fed_avg`` over the round's group, then
  ``sync``); the global model after a round is the first client's (as Fling evaluates it).

What is replaced, each the least that lets the comparison run (RESULTS.md lists them):

1. Modules the checkout imports that this environment lacks: ``easydict`` (a dict with its
   keys as attributes, nested dicts converted), ``prettytable``, ``tqdm``, ``lmdb``, ``timm``,
   ``einops`` (names only, used by logging, progress bars, the ImageNet loader, the Swin and
   ViT models, none on the driven path) and
   ``torchvision`` (:mod:`shims`, plus the data set class names ``fling.dataset`` imports,
   never built, and an empty ``torchvision.utils``).
2. The config: Fling's own ``deep_merge_dicts`` of its ``default_exp_args`` and
   ``flzoo/cifar10/cifar10_fedpart_resnet8_config.py``'s ``exp_args``, then device cpu, 2
   clients, 1 local epoch, batch 4, the case's optimizer (Adam, FedPart's, or SGD) and lr,
   launcher serial; no ``compile_config`` (it seeds,
   sets the multiprocessing start method and writes a logging folder).
3. The model: Fling's own ``resnet8`` class with BatchNorm without running statistics
   (:data:`fling_cases.NORM`), the smooth twin's module swap where the case asks for it, and
   the case's initial weights loaded by name (strict); every client holds a copy, eager (the
   model ``get_model`` builds is discarded: under the serial launcher it is
   ``torch.compile``d; the float32 matmul precision it sets, 'high', is put back).
4. Data and batch order: each client's ``train_dataloader`` yields, each epoch, its 4 samples
   as one batch (``{'input', 'class_id'}``, as Fling's data sets give them) in fedbug's
   order: one permutation an epoch from fedbug's generator for (seed, "client", round, client).
5. The logger: an object with ``logging`` and ``add_scalar`` that keeps nothing (Fling's
   ``Logger`` is a TensorBoard writer with a text file).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.machinery
import importlib.util
import inspect
import io
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.equivalence import shims
from benchmarks.equivalence.fling_cases import NORM, FlingScenario, ScheduleCase, client_data
from benchmarks.equivalence.scenario import smooth_twin
from fedbug.core.seeding import torch_generator

_loaded: dict[str, Any] = {}


class EasyDict(dict):
    """``easydict.EasyDict``: a dict whose keys are attributes too, nested dicts converted."""

    def __init__(self, d: dict | None = None, **kwargs: Any) -> None:
        super().__init__()
        for k, v in {**(d or {}), **kwargs}.items():
            self[k] = v

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, _easy(value))

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def _easy(value: Any) -> Any:
    if isinstance(value, dict) and not isinstance(value, EasyDict):
        return EasyDict(value)
    if isinstance(value, list | tuple):
        return type(value)(_easy(v) for v in value)
    return value


class _NotHere:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{type(self).__name__}: not available in the harness's stand-in")


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)  # torch's import checks ask
    mod.__doc__ = "fedbug equivalence harness stand-in (benchmarks/equivalence/reference_fling.py)"
    mod.__dict__.update(attrs)
    return mod


def install_standins() -> None:
    """Put the stand-ins the checkout's imports need in ``sys.modules``."""
    shims.install_torchvision()
    datasets = sys.modules["torchvision.datasets"]
    for name in ("CIFAR10", "CIFAR100", "MNIST", "EMNIST", "ImageNet"):
        setattr(datasets, name, type(name, (_NotHere,), {}))
    tv = sys.modules["torchvision"]
    tv.utils = _module("torchvision.utils")
    sys.modules["torchvision.utils"] = tv.utils
    sys.modules["easydict"] = _module("easydict", EasyDict=EasyDict)
    sys.modules["prettytable"] = _module(
        "prettytable", PrettyTable=type("PrettyTable", (_NotHere,), {})
    )
    sys.modules["tqdm"] = _module("tqdm", tqdm=lambda it=None, *a, **k: it)
    stubs = ("lmdb", "timm", "timm.models", "timm.models.layers", "einops", "einops.layers")
    for name in (*stubs, "einops.layers.torch"):
        sys.modules[name] = _module(name, __getattr__=_not_here)


def _not_here(name: str) -> type:
    """Any name a stand-in module is asked for: a class that cannot be built."""
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (_NotHere,), {})


def load(path: str | Path) -> dict[str, Any]:
    """Import the checkout's modules once (with the stand-ins)."""
    path = str(Path(path).resolve())
    if _loaded.get("path") == path:
        return _loaded
    if _loaded:
        raise RuntimeError("one Fling checkout per process (a second one is read as --fling-v1)")
    if not (Path(path) / "fling" / "pipeline" / "partial_model_pipeline.py").is_file():
        raise SystemExit(f"{path}: not a checkout of FLAIR-Community/Fling with FedPart")
    install_standins()
    sys.path.insert(0, path)
    names = {
        "pipeline": "fling.pipeline.partial_model_pipeline",
        "client": "fling.component.client",
        "group": "fling.component.group",
        "launcher": "fling.utils.launcher_utils",
        "torch_utils": "fling.utils.torch_utils",
        "config_utils": "fling.utils.config_utils",
        "resnet": "fling.model.resnet",
        "language": "fling.model.language_classifier",
        "default": "flzoo.default_config",
        "resnet8_config": "flzoo.cifar10.cifar10_fedpart_resnet8_config",
    }
    _loaded.update({k: importlib.import_module(v) for k, v in names.items()}, path=path)
    return _loaded


def load_v1(path: str | Path) -> types.ModuleType:
    """The first version's ``partial_model_pipeline.py`` (4464a46) as a module of its own; its
    top-level imports resolve to the main checkout's ``fling`` (its schedule functions use
    none of them)."""
    file = Path(path).resolve() / "fling" / "pipeline" / "partial_model_pipeline.py"
    if "get_train_args_resnet8_v1" not in file.read_text():
        raise SystemExit(f"{path}: not a checkout of Fling's first FedPart version (4464a46)")
    spec = importlib.util.spec_from_file_location("fling_v1_partial_model_pipeline", file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _with_func(pipeline: types.ModuleType, func: str) -> Any:
    """``get_kwds`` of ``pipeline`` with its hard-coded ``func = 'roll'`` set to ``func``."""
    src = inspect.getsource(pipeline.get_kwds)
    if src.count("func = 'roll'") != 1:
        raise RuntimeError("get_kwds no longer hard-codes func = 'roll'")
    ns: dict[str, Any] = dict(vars(pipeline))
    exec(compile(src.replace("func = 'roll'", f"func = {func!r}"), "<get_kwds>", "exec"), ns)
    return ns["get_kwds"]


def _train_args_fn(pipeline: types.ModuleType, case: ScheduleCase) -> Any:
    suffix = "_v1" if case.version == "4464a46" else ""
    name = {"transformer_classifier": "transformer"}.get(case.model, case.model)
    return getattr(pipeline, f"get_train_args_{name}{suffix}")


def group_table(pipeline: types.ModuleType, case: ScheduleCase) -> dict[int, list[str]]:
    """Fling's groups for the case's model: index -> the name substrings of the group, read
    from its Repeat function's answers."""
    fn, out = _train_args_fn(pipeline, case), {}
    with contextlib.redirect_stdout(io.StringIO()):  # 4464a46's get_kwds prints the index
        for rnd in range(400):
            try:
                args, idx = fn(rnd)
            except UnboundLocalError:
                break
            if idx >= 0:
                out[int(idx)] = list(args.keywords)
    return out


def schedule(pipeline: types.ModuleType, case: ScheduleCase) -> list[int | None]:
    """The group index Fling trains in each round (0-based): -1 the full network, None where
    its code stops."""
    fn = _train_args_fn(pipeline, case)
    groups = group_table(pipeline, case)
    get_kwds = _with_func(pipeline, case.func) if case.func != "roll" else pipeline.get_kwds
    out: list[int | None] = []
    with contextlib.redirect_stdout(io.StringIO()):
        for rnd in range(case.num_rounds()):
            if case.variant == "base":  # the commented FedPart(Base) of 4464a46
                out.append(-1 if rnd < 5 else int(get_kwds(rnd - 5, groups)[1]))
                continue
            if case.func != "roll":  # the Repeat function with get_kwds' other func
                saved = pipeline.get_kwds
                pipeline.get_kwds = get_kwds
            try:
                out.append(int(fn(rnd)[1]))
            except UnboundLocalError:
                out.append(None)
            finally:
                if case.func != "roll":
                    pipeline.get_kwds = saved
    return out


def group_params(mods: dict[str, Any], model: nn.Module, keywords: list[str]) -> list[str]:
    """The parameter names Fling's ``get_weights(name='contain')`` picks for a group."""
    args = mods["pipeline"].EasyDict({"name": "contain", "keywords": keywords})
    picked = mods["torch_utils"].get_weights(model, args, return_dict=True)
    return sorted(picked)


def fling_model(mods: dict[str, Any], name: str) -> nn.Module:
    """Fling's own model for a schedule case (its defaults; the transformer with 3 layers)."""
    if name == "transformer_classifier":
        return mods["language"].TransformerClassifier(vocab_size=50, n_layers=3)
    return getattr(mods["resnet"], name)(input_channel=3, class_number=10)


# -- the train case --------------------------------------------------------------------------
class _Samples(torch.utils.data.Dataset):
    """A client's samples as Fling's data sets give them."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input": self.x[i], "class_id": self.y[i]}


class _Replay:
    """A client's ``train_dataloader``: each epoch one batch of all its samples, in the order
    of the next permutation of fedbug's generator for the client's round."""

    def __init__(self, data: _Samples, n: int, gen: torch.Generator) -> None:
        self.data, self.n, self.gen = data, n, gen

    def __iter__(self) -> Any:
        perm = torch.randperm(self.n, generator=self.gen).tolist()
        yield torch.utils.data.default_collate([self.data[j] for j in perm])


class _Logger:
    def logging(self, s: str) -> None:
        return None

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        return None


@contextlib.contextmanager
def _building_clients() -> Any:
    """Around Fling's ``get_client``: its ``get_model`` sets torch's float32 matmul precision to
    'high' for the process and warns that it compiles the model; the precision is put back
    (fedbug's side runs in the same process) and the warnings kept off the report."""
    precision = torch.get_float32_matmul_precision()
    try:
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.set_float32_matmul_precision(precision)


def fling_args(mods: dict[str, Any], s: FlingScenario) -> Any:
    """Fling's config for the case: its defaults merged with its ResNet-8 FedPart config, then
    the case's sizes (see the module docstring, item 2)."""
    merge = mods["config_utils"].deep_merge_dicts
    doc = merge(mods["default"].default_exp_args, mods["resnet8_config"].exp_args)
    doc = merge(
        doc,
        {
            "learn": {
                "device": "cpu",
                "local_eps": s.epochs,
                "batch_size": s.samples,
                "optimizer": {"name": s.optimizer, "lr": s.lr},
            },
            "client": {"client_num": s.clients},
            "launcher": {"name": "serial"},
        },
    )
    return EasyDict(doc)


def fling_resnet8(
    mods: dict[str, Any], s: FlingScenario, initial: dict[str, torch.Tensor]
) -> nn.Module:
    model = mods["resnet"].resnet8(input_channel=3, class_number=s.num_classes, norm_layer=NORM)
    if s.smooth:
        smooth_twin(model)
    model.load_state_dict(initial, strict=True)
    return model


def run_train(
    path: str | Path, s: FlingScenario, initial: dict[str, torch.Tensor]
) -> tuple[list[dict[str, torch.Tensor]], list[int]]:
    """The global parameters after each of the case's rounds of Fling's FedPart pipeline (its
    loop body for round ``rnd`` in ``s.fling_rounds``, from the initial weights), and each
    round's upload in bytes (``aggregate``'s ``trans_cost``)."""
    mods = load(path)
    args = fling_args(mods, s)
    model = fling_resnet8(mods, s, initial)
    data = [_Samples(x, y) for x, y in client_data(s)]
    group = mods["group"].ParameterServerGroup(args, _Logger())
    group.server = types.SimpleNamespace(glob_dict={})
    with _building_clients():
        for i in range(s.clients):
            client = mods["client"].get_client(args=args, client_id=i, train_dataset=data[i])
            client.model = copy.deepcopy(model)
            group.append(client)
    group.initialize()
    launcher = mods["launcher"].SerialLauncher()
    pipeline, out, sent = mods["pipeline"], [], []
    for rnd in s.fling_rounds:
        train_args, _ = pipeline.get_train_args(rnd=rnd, model_name="resnet8")
        aggr_args, _ = pipeline.get_aggr_args(rnd=rnd, model_name="resnet8")
        for i, client in enumerate(group.clients):
            client.train_dataloader = _Replay(
                data[i], s.samples, torch_generator(0, "client", rnd + 1, i)
            )
        launcher.launch(clients=group.clients, lr=s.lr, task_name="train", train_args=train_args)
        sent.append(int(group.aggregate(rnd, aggr_parameter_args=aggr_args)))
        out.append({n: p.detach().clone() for n, p in group.clients[0].model.named_parameters()})
    return out, sent


def lr_is_ignored(path: str | Path, s: FlingScenario, initial: dict[str, torch.Tensor]) -> bool:
    """One client's round 0 trained with the ``lr`` argument 1e-3 and 1e3: the same weights
    (``BaseClient.train`` builds its optimizer from the config alone)."""
    mods = load(path)
    args = fling_args(mods, s)
    x, y = client_data(s)[0]
    after = []
    for lr in (1e-3, 1e3):
        with _building_clients():
            client = mods["client"].get_client(args=args, client_id=0, train_dataset=_Samples(x, y))
        client.model = fling_resnet8(mods, s, initial)
        client.train_dataloader = [{"input": x, "class_id": y}]
        client.train(lr=lr, train_args=None)
        after.append(torch.cat([p.detach().reshape(-1) for p in client.model.parameters()]))
    return bool(torch.equal(after[0], after[1]))
