"""The reference's side of the HeteroFL pair: the authors' own ``Federation`` (``src/fed.py``:
``split_model``, ``distribute``, ``combine``) and ``resnet18`` (``src/models/resnet.py``, with its
``Scaler`` from ``src/modules``), driven as ``train_classifier_fed.py`` drives them.

The checkout's ``src/`` is put on ``sys.path`` and made the working directory while its modules
are imported (``config.py`` reads ``config.yml`` from there). ``cfg`` is filled as
``utils.process_control`` fills it for a ``fix`` split (``model_rate``: the clients' rates,
``global_model_rate`` 1, ``resnet.hidden_size`` the case's small widths, ``data_shape`` the
case's images, ``norm``, ``scale`` and ``mask`` the case's), without importing ``utils.py`` (it
needs torchvision's ``save_image``): its ``make_optimizer`` (SGD with the config's momentum and
weight decay) and ``Local.train``'s loop (zero_grad, the model's own loss on
``{'img', 'label', 'label_split'}``, backward, ``clip_grad_norm_(., 1)``, step; one full batch an
epoch, so the loader's shuffle does not matter) are the few lines re-written here. Each round:
``distribute`` (every client), each client's local training on its sub-model built by the code's
``resnet18(model_rate=r)``, ``combine``. Kept per round: the index sets ``split_model`` gave
each client, those ``combine`` averaged over (the output rows cut to the client's label split,
which ``combine`` writes back into them) and the global state after ``combine``.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

Index = Any  # a key's index set in fed.py: a LongTensor, or (rows, columns)


@dataclass
class ReferenceRun:
    split: list[dict[str, Index]] = field(default_factory=list)  # per client, round 1
    rounds: list[dict[str, Tensor]] = field(default_factory=list)  # global state after combine
    combined: list[list[dict[str, Index]]] = field(default_factory=list)  # per round, client


_loaded: dict[str, Any] = {}


def load(path: str | Path) -> dict[str, Any]:
    """The checkout's ``config.cfg``, ``models`` and ``fed`` modules (imported once)."""
    src = Path(path).resolve() / "src"
    if not (src / "fed.py").is_file():
        raise SystemExit(f"{path}: not a checkout of HeteroFL (no src/fed.py)")
    if _loaded.get("src") != src:
        if _loaded:
            raise SystemExit("one HeteroFL checkout per process")
        sys.path.insert(0, str(src))
        with contextlib.chdir(src):
            import config  # noqa: F401 - reads config.yml from the working directory
            import fed
            import models
        _loaded.update(src=src, cfg=config.cfg, models=models, fed=fed)
    return _loaded


def fill_cfg(cfg: dict[str, Any], case: Any) -> None:
    """``cfg`` as ``process_control`` leaves it for the case (control ``1_N_1_iid_fix_..._{norm}_
    {scale}_{mask}``), with the case's small widths and images."""
    cfg.update(
        model_name="resnet18",
        norm=case.norm,
        scale=bool(case.scale),
        mask=bool(case.mask),
        data_shape=list(case.input_shape),
        classes_size=case.classes,
        resnet={"hidden_size": list(case.hidden)},
        global_model_rate=1.0,
        model_split_mode="fix",
        model_rate=list(case.rates),
        num_users=len(case.rates),
        optimizer_name="SGD",
        lr=case.lr,
        momentum=case.momentum,
        weight_decay=case.weight_decay,
        device="cpu",
    )


def local_train(
    ref: dict[str, Any],
    rate: float,
    params: dict[str, Tensor],
    data: tuple[Tensor, Tensor],
    label_split: list[int],
    epochs: int,
    lr: float,
) -> dict[str, Tensor]:
    """``Local.train`` of ``train_classifier_fed.py``, one full batch an epoch."""
    cfg, (x, y) = ref["cfg"], data
    model = ref["models"].resnet18(model_rate=rate)
    model.load_state_dict(params)
    model.train(True)
    opt = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=cfg["momentum"], weight_decay=cfg["weight_decay"]
    )
    for _ in range(epochs):
        batch = {"img": x, "label": y, "label_split": torch.tensor(label_split)}
        opt.zero_grad()
        out = model(batch)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1)
        opt.step()
    return model.state_dict()


def _copy(idx: dict[str, Index]) -> dict[str, Index]:
    return {k: tuple(t.clone() for t in v) if isinstance(v, (tuple, list)) else v.clone()
            for k, v in idx.items()}  # fmt: skip


def run(path: str | Path, case: Any, initial: dict[str, Tensor],
        data: list[tuple[Tensor, Tensor]]) -> ReferenceRun:  # fmt: skip
    """``case.rounds`` rounds of the authors' code from the global state ``initial``."""
    ref = load(path)
    fill_cfg(ref["cfg"], case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.meshgrid's indexing= note
        model = ref["models"].resnet18(model_rate=1.0)
        model.load_state_dict(initial)
        label_split = [torch.unique(y).tolist() for _, y in data]
        federation = ref["fed"].Federation(model.state_dict(), list(case.rates), label_split)
        users = list(range(len(data)))
        out = ReferenceRun()
        for _ in range(case.rounds):
            local, idx = federation.distribute(users)
            if not out.split:
                out.split = [_copy(i) for i in idx]
            for m, d in enumerate(data):
                rate, split = case.rates[m], label_split[m]
                local[m] = local_train(ref, rate, local[m], d, split, case.local_epochs, case.lr)
            federation.combine(local, idx, users)
            out.combined.append([_copy(i) for i in idx])
            out.rounds.append({k: v.clone() for k, v in federation.global_parameters.items()})
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


def reference_model(path: str | Path, case: Any) -> torch.nn.Module:
    """The code's ``resnet18`` at rate 1 for the case (to check fedbug's copy of it)."""
    ref = load(path)
    fill_cfg(ref["cfg"], case)
    return ref["models"].resnet18(model_rate=1.0)
