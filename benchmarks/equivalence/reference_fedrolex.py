"""The reference's side of the FedRolex pair: the authors' own ``ResnetServerRoll``
(``resnet_server.py``: ``split_model``, ``distribute``, ``combine``, ``step``) and ``resnet18``
(``models/resnet.py`` with its ``Scaler`` from ``modules``), driven as ``main_resnet.py`` drives
them.

The checkout's root is put on ``sys.path`` and made the working directory while its modules are
imported (``config.py`` reads ``config.yml`` from there). Stand-ins: a ``ray`` module whose
``get`` and ``put`` return their argument and whose ``remote`` returns the class or function
unchanged (the server only calls ``ray.get`` on its config and the label split); ``cfg`` filled
by hand as ``utils.process_control`` fills it for a ``fix`` split (``model_rate``: the clients'
rates, ``global_model_rate`` 1, ``resnet.hidden_size`` the case's widths, ``data_shape``, ``norm:
bn``, ``scale`` and ``mask`` on) plus ``main_resnet.py``'s ``overlap: None`` and ``weighting:
avg`` (its defaults); ``utils.py`` and ``data.py`` (torchvision) are not imported. The client
(``resnet_client.py`` ``ResnetClient.step``, whose ``.to('cuda')`` is hard-coded) is re-written
here: ``resnet18(model_rate=r)``, ``load_state_dict``, ``utils.make_optimizer``'s SGD (the
config's momentum and weight decay), per epoch one full batch of ``{'img', 'label',
'label_split'}``: zero_grad, the model's own loss, backward, ``clip_grad_norm_(., 1)``, step.
Each round: ``distribute`` (every client, in id order), local training, ``step`` (``combine``,
then ``rounds += 1``).
"""

from __future__ import annotations

import contextlib
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

Index = Any  # a key's index set in resnet_server.py: a LongTensor, or (rows, columns)


@dataclass
class ReferenceRun:
    split: list[list[dict[str, Index]]] = field(default_factory=list)  # per round, per client
    combined: list[list[dict[str, Index]]] = field(default_factory=list)  # after combine's cut
    rounds: list[dict[str, Tensor]] = field(default_factory=list)  # global state after step


def _ray() -> types.ModuleType:
    """The stand-in ``ray``: get/put the identity, remote a decorator that changes nothing."""
    ray = types.ModuleType("ray")
    ray.get = lambda x: x  # type: ignore[attr-defined]
    ray.put = lambda x: x  # type: ignore[attr-defined]

    def remote(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return lambda c: c

    ray.remote = remote  # type: ignore[attr-defined]
    return ray


_loaded: dict[str, Any] = {}


def load(path: str | Path) -> dict[str, Any]:
    """The checkout's ``config.cfg``, ``models.resnet`` and ``resnet_server`` (imported once)."""
    root = Path(path).resolve()
    if not (root / "resnet_server.py").is_file():
        raise SystemExit(f"{path}: not a checkout of FedRolex (no resnet_server.py)")
    if _loaded.get("root") != root:
        if _loaded:
            raise SystemExit("one FedRolex checkout per process")
        sys.modules.setdefault("ray", _ray())
        sys.path.insert(0, str(root))
        with contextlib.chdir(root):
            import config  # noqa: F401 - reads config.yml from the working directory
            import resnet_server
            from models import resnet
        _loaded.update(root=root, cfg=config.cfg, resnet=resnet, server=resnet_server)
    return _loaded


def fill_cfg(cfg: dict[str, Any], rates: list[float], hidden: list[int], classes: int,
             shape: list[int], momentum: float = 0.9, wd: float = 5e-4) -> None:  # fmt: skip
    """``cfg`` as ``process_control`` and ``main_resnet.py`` leave it (control ``1_N_1_iid_fix_
    ..._bn_1_1``, ``--overlap`` unset, ``--weighting avg``), with the case's widths and images."""
    cfg.update(
        model_name="resnet18",
        norm="bn",
        scale=True,
        mask=True,
        data_shape=shape,
        classes_size=classes,
        resnet={"hidden_size": hidden},
        global_model_rate=1.0,
        model_split_mode="fix",
        model_rate=list(rates),
        num_users=len(rates),
        active_user=len(rates),
        optimizer_name="SGD",
        momentum=momentum,
        weight_decay=wd,
        overlap=None,
        weighting="avg",
        device="cpu",
    )


def server(ref: dict[str, Any], initial: dict[str, Tensor], rates: list[float],
           label_split: list[list[int]]) -> Any:  # fmt: skip
    """A ``ResnetServerRoll`` over the global model ``initial`` (rates per client)."""
    model = ref["resnet"].resnet18(model_rate=1.0, cfg=ref["cfg"])
    model.load_state_dict(initial)
    dataset_ref = {"label_split": label_split}
    return ref["server"].ResnetServerRoll(model, list(rates), dataset_ref, ref["cfg"])


def split_at(path: str | Path, case: Any, rounds: list[int]) -> list[list[dict[str, Index]]]:
    """``split_model``'s index sets of every client at each of the code's ``rounds``."""
    ref = load(path)
    fill_cfg(ref["cfg"], list(case.rates), list(case.hidden), case.classes, [3, 32, 32])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ref["resnet"].resnet18(model_rate=1.0, cfg=ref["cfg"])
        labels = [list(range(case.classes))] * len(case.rates)
        srv = server(ref, model.state_dict(), list(case.rates), labels)
        users = list(range(len(case.rates)))
        out = []
        for r in rounds:
            srv.rounds = r
            out.append([_copy(i) for i in srv.split_model(users)])
    return out


def local_train(ref: dict[str, Any], rate: float, params: dict[str, Tensor],
                data: tuple[Tensor, Tensor], label_split: list[int], epochs: int,
                lr: float) -> dict[str, Tensor]:  # fmt: skip
    """``ResnetClient.step`` on the CPU, one full batch an epoch."""
    cfg, (x, y) = ref["cfg"], data
    model = ref["resnet"].resnet18(model_rate=rate, cfg=cfg)
    model.load_state_dict(params)
    model.train(True)
    opt = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=cfg["momentum"], weight_decay=cfg["weight_decay"]
    )
    for _ in range(epochs):
        batch = {"img": x, "label": y, "label_split": torch.tensor(label_split)}
        model.zero_grad()
        out = model(batch)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1)
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _copy(idx: dict[str, Index]) -> dict[str, Index]:
    return {k: tuple(t.clone() for t in v) if isinstance(v, (tuple, list)) else v.clone()
            for k, v in idx.items()}  # fmt: skip


def run(path: str | Path, case: Any, initial: dict[str, Tensor],
        data: list[tuple[Tensor, Tensor]]) -> ReferenceRun:  # fmt: skip
    """``case.rounds`` rounds of the authors' code from the global state ``initial``."""
    ref = load(path)
    shape = list(case.input_shape)
    fill_cfg(ref["cfg"], list(case.rates), list(case.hidden), case.classes, shape,
             case.momentum, case.weight_decay)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.meshgrid's indexing= note
        label_split = [torch.unique(y).tolist() for _, y in data]
        srv = server(ref, initial, list(case.rates), label_split)
        users = list(range(len(data)))
        out = ReferenceRun()
        for _ in range(case.rounds):
            local, idx = srv.distribute(users)
            out.split.append([_copy(i) for i in idx])
            for m, d in enumerate(data):
                rate, split = case.rates[m], label_split[m]
                local[m] = local_train(ref, rate, local[m], d, split, case.local_epochs, case.lr)
            srv.step(local, idx, users)
            out.combined.append([_copy(i) for i in idx])  # the output rows cut to label splits
            out.rounds.append({k: v.clone() for k, v in srv.global_parameters.items()})
    return out


def index_mask(shape: torch.Size, idx: Index) -> Tensor:
    """The entries of a parameter of ``shape`` that index set ``idx`` names (rows x columns,
    every kernel tap)."""
    mask = torch.zeros(shape, dtype=torch.bool)
    if isinstance(idx, (tuple, list)):
        mask[idx[0][:, None], idx[1][None, :]] = True
    else:
        mask[idx] = True
    return mask
