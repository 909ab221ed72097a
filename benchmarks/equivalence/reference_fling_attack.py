"""Fling's gradient-inversion attack (``fling/utils/attack_utils/dlg.py``, FLAIR-Community/Fling
at faebd06), driven on an attack case.

The harness imports the checkout's own module (it is put on ``sys.path``) with the stand-ins of
:func:`reference_fling.install_standins` (``torchvision``, ``easydict``, ``tqdm``, ...), and
calls ``DLGAttacker(iteration, working_dir, distance_measure=case.distance).attack(model,
dataset, 'cpu', 10, batch_size=len(dataset), use_gt_labels=False,
optim_backend=case.optimizer)`` after ``torch.manual_seed(seed)``: the DLG of the paper (labels
learned), with L-BFGS or Adam, squared (``euclid``) or per-tensor cosine (``cos``) distance.
What is replaced, the least that lets it run: the module's ``Logger`` (a TensorBoard writer
with a text file) by one that keeps nothing; the data set is a list of ``{'input',
'class_id'}`` dicts, as Fling's data sets give them.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.equivalence import reference_fling
from benchmarks.equivalence.attack_case import CLASSES, AttackCase, recording

_loaded: dict[str, Any] = {}


class _NullLogger:
    def __init__(self, path: str) -> None:
        self.path = path

    def logging(self, s: str) -> None:
        pass

    def add_scalars_dict(self, *args: Any, **kwargs: Any) -> None:
        pass


def load(path: str | Path) -> Any:
    """The checkout's ``fling.utils.attack_utils.dlg`` module, imported once."""
    path = str(Path(path).resolve())
    if _loaded.get("path") == path:
        return _loaded["dlg"]
    if not (Path(path) / "fling" / "utils" / "attack_utils" / "dlg.py").is_file():
        raise SystemExit(f"{path}: not a checkout of FLAIR-Community/Fling with attack_utils")
    reference_fling.install_standins()
    sys.path.insert(0, path)
    mod = importlib.import_module("fling.utils.attack_utils.dlg")
    mod.Logger = _NullLogger
    _loaded.update(path=path, dlg=mod)
    return mod


def fling_dlg(path: str, case: AttackCase, model: nn.Module, x: Tensor, y: Tensor) -> dict:
    """Fling's DLG on the case's images as one batch; its trajectory and its own (last, max)
    PSNR."""
    mod = load(path)
    dataset = [{"input": xi, "class_id": int(yi)} for xi, yi in zip(x, y)]
    with tempfile.TemporaryDirectory() as tmp, recording() as traj:
        attacker = mod.DLGAttacker(iteration=case.iterations, working_dir=tmp,
                                   distance_measure=case.distance)  # fmt: skip
        torch.manual_seed(case.seed)
        last, best = attacker.attack(model, dataset, "cpu", CLASSES, batch_size=len(dataset),
                                     use_gt_labels=False, optim_backend=case.optimizer)  # fmt: skip
    return {"traj": traj, "last_psnr": last, "max_psnr": best}
