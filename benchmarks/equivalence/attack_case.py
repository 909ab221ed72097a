"""The attack pair's cases (fedbug's DLG against Fling's ``DLGAttacker``) and fedbug's side.

A case is a tiny model (fedbug's ReLU MLP on 8x8 digits, weights from ``torch.manual_seed``),
one digit scaled to [0, 1], its label, the attack's seed and iteration count. Both sides attack
the same target gradient: the one Fling's ``attack`` computes, the mean cross-entropy against
``softmax(one_hot(label))`` (Fling passes its one-hot label through a softmax before using it as
soft label; a client's training step uses the hard label, which is what fedbug's recorded
updates hold). :func:`recording` replaces ``torch.optim.LBFGS`` for the length of a call, on
both sides alike, to keep each iteration's loss and dummy input: the trajectory compared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from fedbug.attack.inversion import Observation, dlg
from fedbug.models.mlp import MLP

SHAPE = (1, 8, 8)
CLASSES = 10


@dataclass(frozen=True)
class AttackCase:
    name: str
    model_seed: int
    digits: tuple[int, ...]  # indices into scikit-learn's digits: one image each
    seed: int
    iterations: int = 40
    init: str = "uniform"  # fedbug's dlg(init=...); Fling draws torch.rand_like
    hidden: int = 32
    optimizer: str = "lbfgs"  # Fling's optim_backend; fedbug's dlg(optimizer=...)
    distance: str = "euclid"  # Fling's distance_measure: euclid (fedbug l2) or cos (layer_cosine)
    expect: str = "match"  # or "differ"
    fixture: bool = True

    def asdict(self) -> dict[str, Any]:
        return asdict(self)


CASES = [
    AttackCase("dlg-mlp-digit0-s0", 0, (0,), 0),
    AttackCase("dlg-mlp-digit2-s2", 2, (2,), 2),
    AttackCase("dlg-mlp-digit5-s7", 7, (5,), 7),
    AttackCase("dlg-mlp-batch2-s1", 1, (3, 4), 1, iterations=60),
    AttackCase("dlg-mlp-batch4-s3", 3, (10, 11, 12, 13), 3, iterations=60, hidden=64),
    # Fling's other backend (Adam at 1e-3) and its 'cos' distance: fedbug's dlg options
    AttackCase("dlg-adam-mlp-digit0-s0", 0, (0,), 0, iterations=200, optimizer="adam"),
    AttackCase("cos-lbfgs-mlp-digit2-s2", 2, (2,), 2, distance="cos"),
    AttackCase(
        "cos-adam-mlp-batch2-s1", 1, (3, 4), 1, iterations=200, optimizer="adam", distance="cos"
    ),  # fmt: skip
    # fedbug's default start, N(0, 1) (DLG's code): another trajectory, the same kind of result
    AttackCase("dlg-mlp-digit0-s0-normal-init", 0, (0,), 0, init="normal", expect="differ"),
]


def inputs(case: AttackCase) -> tuple[nn.Module, Tensor, Tensor]:
    """(the model, in eval mode; the images ``N, 1, 8, 8`` in [0, 1]; the labels ``[N]``)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    torch.manual_seed(case.model_seed)
    model = MLP(SHAPE, CLASSES, hidden=(case.hidden,)).eval()
    idx = list(case.digits)
    x = torch.tensor(digits.data[idx] / 16.0, dtype=torch.float32).reshape(len(idx), *SHAPE)
    return model, x, torch.tensor([int(t) for t in digits.target[idx]])


def digest(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Any]:
    """What identifies a case's inputs in a fixture."""
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"y": y.tolist(), "x_sum": float(x.sum()), "w_sum": float(w.sum()),
            "w_l2": float(w.norm()), "w_first": float(w[0])}  # fmt: skip


def flings_target(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """The gradient Fling's ``attack`` inverts: mean cross-entropy of ``model(x)`` against the
    soft label ``softmax(one_hot(y))``, over every parameter, by name."""
    soft = torch.softmax(nn.functional.one_hot(y, CLASSES).float(), dim=-1)
    loss = -(soft * torch.log_softmax(model(x), dim=-1)).sum(1).mean()
    names = [k for k, _ in model.named_parameters()]
    return dict(zip(names, torch.autograd.grad(loss, list(model.parameters()))))


DISTANCE = {"euclid": "l2", "cos": "layer_cosine"}  # Fling's name -> fedbug's


class Trajectory:
    """Each optimiser step's returned loss (the loss where the step starts) and, after the
    step, its first parameter (the dummy input) and second (the soft labels' logits)."""

    def __init__(self) -> None:
        self.loss: list[float] = []
        self.x: list[Tensor] = []
        self.labels: list[Tensor] = []


def _recording_class(original: type, traj: Trajectory) -> type:
    class Recording(original):  # type: ignore[misc, valid-type]
        def step(self, closure):  # noqa: ANN001, ANN202
            loss = super().step(closure)
            params = self.param_groups[0]["params"]
            traj.loss.append(float(loss.detach()))
            traj.x.append(params[0].detach().clone())
            traj.labels.append(params[1].detach().clone() if len(params) > 1 else None)
            return loss

    return Recording


@contextlib.contextmanager
def recording() -> Iterator[Trajectory]:
    """``torch.optim.LBFGS`` and ``torch.optim.Adam`` replaced, inside the block, by subclasses
    that record each step into the yielded :class:`Trajectory` (the step itself is torch's)."""
    traj = Trajectory()
    originals = {name: getattr(torch.optim, name) for name in ("LBFGS", "Adam")}
    for name, cls in originals.items():
        setattr(torch.optim, name, _recording_class(cls, traj))
    try:
        yield traj
    finally:
        for name, cls in originals.items():
            setattr(torch.optim, name, cls)


def fedbug_dlg(case: AttackCase, model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Any]:
    """fedbug's :func:`~fedbug.attack.inversion.dlg` on Fling's target: labels learned, the
    case's ``init``, seed, optimiser and distance."""
    obs = Observation(model, flings_target(model, x, y), SHAPE, len(y), CLASSES)
    with recording() as traj:
        found, labels = dlg(obs, iterations=case.iterations, seed=case.seed, init=case.init,
                            optimizer=case.optimizer, distance=DISTANCE[case.distance])  # fmt: skip
    return {"traj": traj, "x": found, "label": labels.tolist()}


def flings_psnr(found: Tensor, true: Tensor) -> float:
    """Fling's ``_reconstruction_psnr`` (range 1, unclamped), written out to score both sides."""
    mse = ((found.flatten(1) - true.flatten(1)) ** 2).mean(1)
    return float((-10 * torch.log10(mse)).mean())


def skimage_psnr(found: Tensor, true: Tensor) -> float:
    """fedbug's score (:func:`fedbug.attack.scoring.image_scores`), the mean over the images,
    each paired with its nearest distinct reconstruction (Fling pairs them by position)."""
    from fedbug.attack.scoring import image_scores, match_order

    per = image_scores(true, found[match_order(true, found)])
    return sum(p["psnr"] for p in per) / len(per)


def compare(fling: dict[str, Any], fed: dict[str, Any], true: Tensor, tol: float) -> dict[str, Any]:
    """Per iteration, max |x_fedbug - x_fling| (images in [0, 1]) and the losses' relative
    difference; the last iteration within ``tol``; both sides' final scores."""
    tf, tb = fling["traj"], fed["traj"]
    n = min(len(tf.loss), len(tb.loss))
    dx = [float((tb.x[i] - tf.x[i]).abs().max()) for i in range(n)]
    dl = [abs(tb.loss[i] - tf.loss[i]) / max(abs(tf.loss[i]), 1e-30) for i in range(n)]
    within = next((i for i, d in enumerate(dx) if d > tol), n)
    return {
        "iterations": [len(tf.loss), len(tb.loss)],
        "x_max_abs": dx,
        "loss_rel": dl,
        "agree_through": within,
        "fling_loss": tf.loss,
        "fling_final": {"psnr_fling": flings_psnr(tf.x[-1], true),
                        "psnr_skimage": skimage_psnr(tf.x[-1], true),
                        "last_psnr": fling["last_psnr"], "max_psnr": fling["max_psnr"]},
        "fedbug_final": {"psnr_fling": flings_psnr(fed["x"], true),
                         "psnr_skimage": skimage_psnr(fed["x"], true), "label": fed["label"]},
    }  # fmt: skip
