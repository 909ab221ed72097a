"""The SLT pair's reference side: k1l1/SLT's own code, imported from a checkout (put on
``sys.path`` on purpose; never copied here) and called unchanged.

* :func:`schedule` runs ``algorithms.slt.SLTServer.initialize`` (its configurations from the
  checkout's ``nets/SLTNets/configs/config__resnet20.json`` for the constraint, its switching
  rounds ``_ranges`` and ``_configs``) on the ResNet20 state dict; the base class's
  ``initialize`` (devices, data split, evaluation device) is skipped for that call.
* :func:`extract` calls ``utils.slt_submodel.extract_submodel_resnet_structure``.
* :func:`one_round` drives one round as ``FedAvgServer.run`` does, without ``run``: the
  server's ``pre_round`` (its device selection from a seeded ``numpy`` generator, the round's
  configuration, each device's sub-model and frozen keys), each ``SubsetDevice``'s
  ``init_model`` / ``set_model_state_dict`` (the SLT ResNet's hook resizes every parameter and
  freezes the frozen keys) / ``device_round`` (one epoch, batch 32, SGD over the parameters that
  require gradients), then ``post_round`` (``embedd_submodel`` + ``model_averaging``). The lr is
  given (the code's cosine schedule sets it per round in ``run``).
* :func:`eval_logits` builds the evaluation model as ``measure_accuracy`` does (a fresh ResNet20
  loaded, ``strict=False``, with the round's configuration's sub-model) and returns its logits.

``algorithms/fedavg.py`` imports ``tqdm`` (absent here) for ``run``'s progress bar: a stand-in
module takes its place. The devices' data is a ``Subset`` of a ``TensorDataset`` carrying the
``train`` flag ``FedAvgEvaluation`` asserts on.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Subset, TensorDataset

from benchmarks.equivalence import shims

CONFIGS = "nets/SLTNets/configs/config__resnet20.json"


def load(path: str | Path) -> dict[str, Any]:
    """The reference's modules, imported from the checkout at ``path``."""
    path = str(Path(path).resolve())
    shims.install_tqdm()
    if path not in sys.path:
        sys.path.insert(0, path)
    with contextlib.chdir(path):
        from algorithms import fedavg
        from algorithms.fd import SubsetDevice
        from algorithms.slt import SLTServer
        from nets.SLTNets.resnet_cifar import ResNet20
        from utils.slt_submodel import extract_submodel_resnet_structure
    return {
        "path": path,
        "FedAvgServer": fedavg.FedAvgServer,
        "SLTServer": SLTServer,
        "SubsetDevice": SubsetDevice,
        "ResNet20": ResNet20,
        "extract": extract_submodel_resnet_structure,
    }


def configs(ref: dict[str, Any], constraint: float) -> list[list[float]]:
    """The checkout's configuration list for ``constraint`` (what ``initialize`` reads)."""
    import json

    with open(Path(ref["path"]) / CONFIGS) as fd:
        return json.load(fd)[str(constraint)]["values"]


def server(
    ref: dict[str, Any],
    constraint: float,
    rounds: int,
    global_sd: dict[str, Tensor],
    devices: int = 2,
) -> Any:
    """An ``SLTServer`` after its own ``initialize`` (the base class's skipped)."""
    srv = ref["SLTServer"]("")
    srv.nn_configs_path = str(Path(ref["path"]) / CONFIGS)
    srv.memory_constraints_list = [constraint] * devices
    srv.extract_fnc = ref["extract"]
    srv.n_rounds = rounds
    srv.n_devices = srv.n_devices_per_round = devices
    srv._global_model = {k: v.clone() for k, v in global_sd.items()}
    base = ref["FedAvgServer"]
    kept = base.initialize
    base.initialize = lambda self: None
    try:
        srv.initialize()
    finally:
        base.initialize = kept
    return srv


def schedule(ref: dict[str, Any], constraint: float, rounds: int) -> tuple[list[int], list]:
    """(``_ranges``, ``_configs``) of an N = ``rounds`` run at ``constraint``."""
    srv = server(ref, constraint, rounds, ref["ResNet20"]().state_dict())
    return list(srv._ranges), [list(c) for c in srv._configs]


def extract(ref: dict[str, Any], s: float, f: float, sd: dict[str, Tensor]) -> tuple[dict, list]:
    """(index sets by key, frozen keys) of configuration (s, f) on state dict ``sd``."""
    _, idx, frozen = ref["extract"](s, f, sd)
    return idx, list(frozen)


def one_round(
    ref: dict[str, Any],
    constraint: float,
    rounds: int,
    round_n: int,
    init: dict[str, Tensor],
    data: list[tuple[Tensor, Tensor]],
    lr: float,
    momentum: float,
    weight_decay: float,
    seed: int = 0,
) -> tuple[dict, list]:
    """The global state dict after round ``round_n`` (0-based) from ``init``, device i on
    ``data[i]``; and the round's configuration [s, f]."""
    srv = server(ref, constraint, rounds, init, len(data))
    devices = []
    for i, (x, y) in enumerate(data):
        dev = ref["SubsetDevice"](i, "")
        dev.set_model(ref["ResNet20"], {})
        ds = TensorDataset(x, y)
        ds.train = True  # type: ignore[attr-defined]
        dev.set_train_data(Subset(ds, list(range(len(y)))))
        dev.set_loss_function(torch.nn.CrossEntropyLoss)
        dev.set_optimizer(torch.optim.SGD, {"weight_decay": weight_decay, "momentum": momentum})
        dev.set_torch_device("cpu")
        devices.append(dev)
    srv._devices_list = devices
    torch.manual_seed(seed)  # the DataLoader's shuffle (one batch: its order only)
    idxs, device_models = srv.pre_round(round_n, np.random.default_rng(seed))
    for i, dev_idx in enumerate(idxs):
        dev = devices[dev_idx]
        dev.lr = lr
        dev.init_model()
        dev.set_model_state_dict(device_models[i])
    for dev_idx in idxs:
        devices[dev_idx].device_round()
    srv.post_round(round_n, idxs)
    return {k: v.clone() for k, v in srv._global_model.items()}, list(srv._current_config)


def eval_logits(
    ref: dict[str, Any], config: list[float], global_sd: dict[str, Tensor], x: Tensor
) -> Tensor:
    """The logits of ``measure_accuracy``'s evaluation model on ``x``."""
    model = ref["ResNet20"]()
    model.load_state_dict(ref["extract"](config[0], config[1], global_sd)[0], strict=False)
    model.eval()
    with torch.no_grad():
        return model(x)
