"""What the attack cannot replay exactly, found before it runs.

The attack models a client's local training as one gradient of the task's loss of the recorded
inputs at the round's received weights (several steps: one scaled gradient). A run is checked
against that model, from its config, the recorded update and the attacked model; each problem is
a :class:`Finding`, one line naming the key and the fix:

* ``refuse`` (``fedbug attack`` exits 2 unless ``--allow-inexact``): augmentation drawn per
  batch (the recorded truth is the images before it), dropout (a mask per step), Adam (its first
  step is the gradient's sign), an algorithm that adds to the local objective or trains modules
  the model lacks, single-step DLG/iDLG on a multi-step update, DLG's squared distance on a step
  that ``clip_grad_norm`` scaled;
* ``warn`` (the attack still makes sense as an approximation, its score a lower bound of the
  leak): a multi-step update taken as one scaled gradient (momentum, gradual unfreezing: units
  trained for different numbers of steps), an algorithm whose client session changes the steps
  or keeps personal units, a recorded client update under ``dp:`` (the trusted server's view,
  which DP-FedAvg does not protect: ``--released`` attacks the noised release), an update under
  ``dp_sgd:`` (clipped per sample and noised on the client: what the attack measures), a
  released update that averages several clients.

Modelled, not refused: BatchNorm (:func:`attack_mode` puts it in training mode, batch
statistics, as the client's step used), weight decay (taken out of the observation), partial
uploads (only the sent units are matched).

:func:`replay_error` checks the whole model against the truth where it is exact (one step): the
gradient of the recorded inputs at the received weights against the observed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from fedbug.attack.inversion import Observation, dummy_gradient, total, unrolled_update

OBJECTIVE_HOOKS = ("loss", "logits", "extra_loss", "adjust_grads", "adjust_grads_after_clipping")
REPLAY_TOL = 1e-3  # relative L2 error of the truth's gradient that counts as an exact replay


@dataclass(frozen=True)
class Finding:
    kind: str  # "refuse" or "warn"
    key: str
    line: str

    def __str__(self) -> str:
        return f"{self.key}: {self.line}"


def _overridden(cls: type, hooks: tuple[str, ...]) -> list[str]:
    from fedbug.algorithms.base import Algorithm

    return [h for h in hooks if getattr(cls, h, None) is not getattr(Algorithm, h, None)]


def attack_mode(model: nn.Module) -> list[Finding]:
    """The attacked model as the client's step ran it: evaluation mode except BatchNorm, which
    trains on batch statistics (modelled); dropout with p > 0 cannot be replayed (refused)."""
    model.eval()
    found = []
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.train()
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            found.append(
                Finding(
                    "refuse",
                    "model",
                    f"{name or 'the model'} drops units at random (p={m.p})"
                    ", a mask per step the attack cannot replay; rerun without dropout",
                )
            )
    return found


def algorithm_findings(cfg: Any) -> list[Finding]:
    """An algorithm's hooks (never its name): what it adds to the local step."""
    from fedbug.algorithms import ALGORITHMS

    cls, name, out = ALGORITHMS.get(cfg.algorithm), cfg.algorithm, []
    terms = _overridden(cls, OBJECTIVE_HOOKS)
    if terms:
        out.append(
            Finding(
                "refuse",
                "algorithm",
                f"{name} adds to the local objective "
                f"({', '.join(terms)}) what the attack's gradient omits; attack a "
                "fedavg run (or --allow-inexact: the task's loss alone)",
            )
        )
    if _overridden(cls, ("wrap_model",)):
        out.append(
            Finding(
                "refuse",
                "algorithm",
                f"{name} trains a sub-model or personal modules (wrap_model) that the "
                "attack's forward pass does not run as the client did; attack a fedavg run",
            )
        )
    elif _overridden(cls, ("start_client",)):
        out.append(
            Finding(
                "warn",
                "algorithm",
                f"{name}'s client session changes the local "
                "steps (start_client): the replay is an approximation",
            )
        )
    if _overridden(cls, ("local_units",)):
        out.append(
            Finding(
                "warn",
                "algorithm",
                f"{name} keeps personal units on the clients: "
                "the attacked model has the global ones there",
            )
        )
    return out


def config_findings(cfg: Any, meta: dict[str, Any], method: str, released: bool) -> list[Finding]:
    """The run's training options against the attack's model of one step."""
    out = []
    augment = meta.get("augment", cfg.augment)  # "auto": recorded before the name was
    if augment == "auto":
        out.append(
            Finding(
                "warn",
                "augment",
                "auto: the record does not say whether the data set augments; if it does, "
                "the scores compare with the images before augmentation",
            )
        )
    elif augment != "none":
        out.append(
            Finding(
                "refuse",
                "augment",
                f"{augment} draws a transform per batch and the "
                "recorded truth is the images before it; rerun with augment: none",
            )
        )
    if cfg.optimizer != "sgd":
        out.append(
            Finding(
                "refuse",
                "optimizer",
                f"{cfg.optimizer}'s step is not a scaled "
                "gradient (Adam's first is its sign); rerun with optimizer: sgd",
            )
        )
    steps = int(meta["steps"])
    if steps > 1 and method in ("dlg", "idlg"):
        out.append(
            Finding(
                "refuse",
                f"--method {method}",
                "matches one step's gradient and the "
                f"update is of {steps} local steps; use --method ig (or auto), or "
                "rerun with local_steps: 1",
            )
        )
    elif steps > 1 and method != "ig-unrolled":
        out.append(
            Finding(
                "warn",
                "local_steps",
                f"{steps} steps taken as one scaled gradient at "
                "the received weights (not unrolled; momentum and units that train "
                "part of the steps, as under gradual unfreezing, make it "
                "approximate): the score is a lower bound",
            )
        )
    if cfg.dp_sgd is not None:
        out.append(
            Finding(
                "warn",
                "dp_sgd",
                "each sample's gradient was clipped and the client added noise before sending: "
                "the attack measures what DP-SGD leaves, matching a gradient it does not model",
            )
        )
    if cfg.dp is not None and not released:
        out.append(
            Finding(
                "warn",
                "dp",
                "the recorded update is the client's own, before the "
                "clip and the server's noise (the trusted server's view, which "
                "DP-FedAvg does not protect); --released attacks the noised release",
            )
        )
    return out


def clipped_findings(cfg: Any, obs: Observation, method: str, steps: int) -> list[Finding]:
    """DLG's squared distance needs the unclipped gradient: refused where ``clip_grad_norm``
    scaled the one step (its norm is at the clip)."""
    c = cfg.clip_grad_norm
    if c is None or steps != 1 or method not in ("dlg", "idlg"):
        return []
    norm = float(torch.sqrt(total((g.double() ** 2).sum() for g in obs.target.values())))
    if norm < 0.999 * c:
        return []
    return [
        Finding(
            "refuse",
            "clip_grad_norm",
            f"{c:g} scaled this step (its norm is at the "
            "clip), which DLG's squared distance sees; use --method ig (cosine, "
            "blind to scale) or rerun without clip_grad_norm",
        )
    ]


def replay_error(obs: Observation, inputs: Tensor, labels: Tensor) -> float:
    """The relative L2 error between the observation and what the recorded inputs give at the
    received weights: their mean cross-entropy's gradient, or, where ``obs.unroll`` is set,
    the update of the client's steps replayed on them in their first epoch's order (0: the
    attack's model of the client is exact)."""
    match = unrolled_update if obs.unroll is not None else dummy_gradient
    x = inputs.reshape(-1, *obs.shape).to(torch.float32)
    y = nn.functional.one_hot(labels.flatten(), obs.num_classes).float()
    g = match(obs, x, y)
    num = total(((g[k].detach() - t) ** 2).sum() for k, t in obs.target.items())
    den = total((t**2).sum() for t in obs.target.values())
    return float(torch.sqrt(num / den.clamp_min(1e-30)))


#: Why a replay misses where nothing more is known
NOT_FROM_CONFIG = "the client's training does not replay from the config"


def replay_finding(
    error: float, what: str = "the recorded inputs' gradient", why: str = NOT_FROM_CONFIG
) -> list[Finding]:
    """A warning where ``what`` (the one-step gradient, or the unrolled steps' update) misses
    the observed update by more than :data:`REPLAY_TOL`; ``why``: its cause where known."""
    if error <= REPLAY_TOL:
        return []
    return [
        Finding(
            "warn",
            "replay",
            f"{what} misses the update by {error:.2g} (relative): {why}; the score is a lower "
            "bound",
        )
    ]
