"""The CoCoFL pair's reference side: k1l1/CoCoFL's own code, imported from a checkout (put on
``sys.path`` on purpose; never copied here) and called unchanged.

* :func:`filter_table` calls ``nets.QuantizedNets.utils.utils.filter_table`` with a
  ``utils.resources.DeviceResources`` of constant limits, on the tables ``QResNet18`` and
  ``QResNet50`` read at import (``nets/QuantizedNets/ResNet/resnet.py``).
* :func:`model_averaging` calls ``algorithms.cocofl.CoCoFLServer.model_averaging``.
* :func:`one_round` drives one round as ``FedAvgServer.run`` and ``post_round`` do: every
  device (``CoCoFLDevice``: ``init_model``, ``set_model_state_dict(global)``,
  ``device_training``, ``get_model_state_dict``), then ``model_averaging`` with the global model.
  Each device's freezing configuration is given (``QResNet18.get_freezing_config`` returns it),
  as its data (a list of (image, label) pairs), lr, SGD with weight decay and batch size 32.

The checkout opens its tables by relative path at import, so it is imported with the working
directory at the checkout. ``algorithms/fedavg.py`` imports ``tqdm`` (absent here) for its
progress bar, which the driven path never draws: a stand-in module takes its place.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from benchmarks.equivalence import shims


def load(path: str | Path) -> dict[str, Any]:
    """The reference's modules, imported from the checkout at ``path``."""
    path = str(Path(path).resolve())
    shims.install_tqdm()
    if path not in sys.path:
        sys.path.insert(0, path)
    with contextlib.chdir(path):
        from algorithms.cocofl import CoCoFLDevice, CoCoFLServer
        from nets.QuantizedNets.ResNet import resnet
        from nets.QuantizedNets.utils.utils import filter_table
        from utils.resources import Constant, DeviceResources
    return {
        "CoCoFLDevice": CoCoFLDevice,
        "CoCoFLServer": CoCoFLServer,
        "resnet": resnet,
        "filter_table": filter_table,
        "Constant": Constant,
        "DeviceResources": DeviceResources,
    }


def resources(ref: dict[str, Any], time: float, data: float, memory: float) -> Any:
    res = ref["DeviceResources"]()
    c = ref["Constant"]
    res.set_all(c(time), c(data), c(memory))
    return res


def tables(ref: dict[str, Any]) -> dict[str, tuple[list[dict[str, Any]], int]]:
    """The ResNet tables the reference reads at import, with their block counts."""
    m = ref["resnet"]
    return {
        "QResNet18": (m._g_table_qresnet18, m.QResNet18.n_freezable_layers()),
        "QResNet50": (m._g_table_qresnet50, m.QResNet50.n_freezable_layers()),
    }


def filter_table(ref: dict[str, Any], table: list[dict[str, Any]], n: int,
                 limits: tuple[float, float, float]) -> list[list[int]] | None:  # fmt: skip
    """The configurations (frozen blocks) the reference lets a device with ``limits`` choose
    from; None where it finds none (its assertion)."""
    try:
        return ref["filter_table"](resources(ref, *limits), table, n)
    except AssertionError:
        return None


def model_averaging(ref: dict[str, Any], sent: list[dict[str, Tensor]],
                    global_sd: dict[str, Tensor]) -> dict[str, Tensor]:  # fmt: skip
    return ref["CoCoFLServer"].model_averaging(sent, eval_device_dict=global_sd)


def one_round(
    ref: dict[str, Any],
    init: dict[str, Tensor],
    data: list[tuple[Tensor, Tensor]],
    freezes: list[list[int]],
    lr: float,
    weight_decay: float,
    seed: int,
) -> dict[str, Tensor]:
    """The global state dict after one round from ``init`` (a state dict by the reference's
    names, loaded into ``QResNet18(freeze=[])`` with strict=False: its bookkeeping buffers keep
    their initial values), device i training on ``data[i]`` with configuration ``freezes[i]``."""
    qresnet = ref["resnet"].QResNet18
    torch.manual_seed(seed)  # the reference's DataLoader shuffles with the global generator
    model = qresnet(freeze=[])
    model.load_state_dict(init, strict=False)
    global_sd = {k: v.clone() for k, v in model.state_dict().items()}
    sent = []
    for i, ((x, y), freeze) in enumerate(zip(data, freezes)):
        dev = ref["CoCoFLDevice"](i)
        dev.set_model(qresnet, {"num_classes": 10})
        dev.set_train_data([(x[j], y[j]) for j in range(len(y))])
        dev.lr = lr
        dev.set_optimizer(torch.optim.SGD, {"weight_decay": weight_decay})
        dev.set_torch_device("cpu")
        dev.resources = resources(ref, 1.0, 1.0, 1.0)
        dev.init_model()
        dev.set_model_state_dict(global_sd)
        qresnet.get_freezing_config = staticmethod(lambda _res, f=list(freeze): f)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # int8 ops: torch's deprecation warning
            dev.device_training()
        sent.append(dev.get_model_state_dict())
    return model_averaging(ref, sent, global_sd)
