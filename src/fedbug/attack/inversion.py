"""Gradient inversion: reconstruct a client's training inputs from the update the server saw.

* :func:`dlg` -- Deep Leakage from Gradients (Zhu et al. 2019): dummy inputs and soft labels
  optimised with L-BFGS so that their gradient matches the observed one in squared distance.
* :func:`idlg_labels` -- iDLG (Zhao et al. 2020): for one image, the label is the row of the
  last layer's weight gradient whose sum is negative (cross-entropy after a non-negative
  activation); :func:`dlg` then optimises the inputs only, with that label fixed.
* :func:`inverting_gradients` -- Inverting Gradients (Geiping et al. 2020): cosine distance
  between the gradients plus total variation of the images, optimised with Adam (signed
  gradients, as in the paper's code). For a multi-step FedAvg update the paper's attack
  (its section 6) unrolls the client's local steps on the dummy inputs and matches the update
  they give (:class:`Unroll`, :func:`unrolled_update`); without an :class:`Unroll` the update
  is matched as one scaled gradient (cheaper; the cosine distance does not see the scale).

The attacker sees what the server sees: only the units that were sent take part in the match
(a frozen or withheld unit's gradient is unknown); every other parameter keeps the round's
received weights. Nothing here reads the true inputs: they are for scoring only
(:mod:`fedbug.attack.scoring`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn
from torch.func import functional_call


@dataclass
class Unroll:
    """A client's local training as the server knows it from the config, to replay on dummy
    inputs: ``trained[k]`` the parameters local step ``k`` (0-based) trained, sent or not (empty:
    an idle step, its batch drawn and unused), SGD at ``lr`` with ``momentum`` and
    ``weight_decay`` (torch's, no dampening), each step's gradient clipped to L2 ``clip`` over
    the trained parameters where given. Step ``k`` trains on the dummy inputs' batch ``k mod
    per_epoch`` of ``batch_size`` (Inverting Gradients' code: the attacker does not know the
    client's shuffle; the first epoch's order is free, as the dummy inputs are, and later epochs
    are taken in the same order), or, where ``batches`` is given, on the rows ``batches[k]``
    (a server told the client's shuffle)."""

    trained: list[tuple[str, ...]]
    lr: float
    batch_size: int
    per_epoch: int
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip: float | None = None
    batches: list[Tensor] | None = None


@dataclass
class Observation:
    """What the server holds about one client's update, as a gradient to match.

    ``model`` carries the round's received weights; ``target`` maps each sent parameter's name to
    its observed gradient (for a single SGD step, ``-delta / lr``; for several, ``-delta``, a
    scaled gradient); ``shape`` is one input's shape (as the model takes it), ``num_images`` how
    many inputs the update was computed on, ``num_classes`` the model's outputs,
    ``image_shape`` (``C, H, W``) how a flat input is a picture (None: as the model takes it);
    ``unroll`` the client's local steps, where the update is matched by replaying them (then
    ``target`` is ``-delta``: :func:`unrolled_update`)."""

    model: nn.Module
    target: dict[str, Tensor]
    shape: tuple[int, ...]
    num_images: int
    num_classes: int
    image_shape: tuple[int, ...] | None = None
    unroll: Unroll | None = None

    def as_images(self, x: Tensor) -> Tensor | None:
        """``x`` as ``N, C, H, W`` images (None: the inputs are not images)."""
        if self.image_shape is not None:
            return x.reshape(x.shape[0], *self.image_shape)
        return x if x.dim() == 4 else None


def _params(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach() for k, v in model.named_parameters()}


def dummy_gradient(obs: Observation, x: Tensor, y_soft: Tensor) -> dict[str, Tensor]:
    """The sent parameters' gradient of the mean cross-entropy of ``x`` against the soft labels
    ``y_soft`` (probabilities), kept differentiable in ``x`` and ``y_soft``."""
    params = _params(obs.model)
    sent = {k: params[k].clone().requires_grad_(True) for k in obs.target}
    logits = functional_call(obs.model, {**params, **sent}, (x,))
    loss = -(y_soft * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
    grads = torch.autograd.grad(loss, list(sent.values()), create_graph=True)
    return dict(zip(sent, grads))


def unrolled_update(obs: Observation, x: Tensor, y_soft: Tensor) -> dict[str, Tensor]:
    """``-delta`` of the matched parameters after the client's local steps (``obs.unroll``)
    replayed on the dummy inputs ``x`` and soft labels ``y_soft``, differentiable in both; the
    parameters a step trains and the client did not send train too (from the received
    weights), every other keeps them. Exact where the dummy inputs are the client's in its
    batch order (:class:`Unroll`)."""
    u = obs.unroll
    if u is None:
        raise ValueError("unrolled_update needs an observation with an Unroll")
    params = _params(obs.model)
    moving = dict.fromkeys([*obs.target, *(n for step in u.trained for n in step)])
    start = {k: params[k] for k in moving}
    w = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    buf: dict[str, Tensor] = {}
    bs = u.batch_size
    for k, names in enumerate(u.trained):
        if not names:
            continue
        if u.batches is not None:
            xb, yb = x[u.batches[k]], y_soft[u.batches[k]]
        else:
            pos = k % u.per_epoch
            xb, yb = x[pos * bs : (pos + 1) * bs], y_soft[pos * bs : (pos + 1) * bs]
        # a fresh node a step: the step's gradient is the partial derivative at the current
        # weights, not through an earlier step whose gradient read a weight not yet trained
        w = {n: t.view_as(t) for n, t in w.items()}
        logits = functional_call(obs.model, {**params, **w}, (xb,))
        loss = -(yb * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
        got = torch.autograd.grad(loss, [w[n] for n in names], create_graph=True, allow_unused=True)
        # a trained parameter the forward pass did not use steps on zeros, as the client's does
        grads = {n: torch.zeros_like(w[n]) if g is None else g for n, g in zip(names, got)}
        if u.clip is not None:  # (clamped: the square root's derivative at 0 is infinite)
            norm = torch.stack([(g**2).sum() for g in grads.values()]).sum().clamp_min(1e-24).sqrt()
            scale = torch.clamp(u.clip / (norm + 1e-6), max=1.0)  # torch's clip_grad_norm_
            grads = {n: g * scale for n, g in grads.items()}
        for n, g in grads.items():
            d = g + u.weight_decay * w[n] if u.weight_decay else g
            if u.momentum:  # torch's buffer: the first step's d, then momentum x buffer + d
                buf[n] = u.momentum * buf[n] + d if n in buf else d
                d = buf[n]
            w[n] = w[n] - u.lr * d
    return {k: start[k] - w[k] for k in obs.target}


def total(terms: Iterable[Tensor]) -> Tensor:
    """The terms' sum, in order (Python's ``sum``, typed: the same additions bit for bit)."""
    return cast(Tensor, sum(terms))


def l2_distance(dummy: dict[str, Tensor], target: dict[str, Tensor]) -> Tensor:
    """DLG's distance: the summed squared difference over the sent parameters."""
    return total(((dummy[k] - target[k]) ** 2).sum() for k in target)


def cosine_distance(dummy: dict[str, Tensor], target: dict[str, Tensor]) -> Tensor:
    """Inverting Gradients' distance: 1 - cosine similarity of the concatenated gradients."""
    dot = total((dummy[k] * target[k]).sum() for k in target)
    dn = torch.sqrt(total((dummy[k] ** 2).sum() for k in target))
    tn = torch.sqrt(total((target[k] ** 2).sum() for k in target))
    return 1 - dot / (dn * tn + 1e-12)


def layer_cosine_distance(dummy: dict[str, Tensor], target: dict[str, Tensor]) -> Tensor:
    """Fling's ``'cos'`` distance: the sum over the sent parameters of 1 - each tensor's own
    cosine similarity (torch's, eps 1e-10), which weighs every tensor alike whatever its size
    (Inverting Gradients' :func:`cosine_distance` takes one cosine over all of them)."""
    return total(
        1 - nn.functional.cosine_similarity(dummy[k].flatten(), target[k].flatten(), 0, 1e-10)
        for k in target
    )


DISTANCES = {"l2": l2_distance, "cosine": cosine_distance, "layer_cosine": layer_cosine_distance}


def total_variation(x: Tensor) -> Tensor:
    """Mean absolute difference of neighbouring pixels (images ``N, C, H, W``)."""
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().mean()
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().mean()
    return dx + dy


def last_layer(obs: Observation) -> str | None:
    """The sent 2-D weight with ``num_classes`` rows declared last in the model (None: the
    classifier was not sent)."""
    names = [
        k
        for k, v in obs.model.named_parameters()
        if v.dim() == 2 and v.shape[0] == obs.num_classes and k in obs.target
    ]
    return names[-1] if names else None


def idlg_labels(obs: Observation) -> Tensor | None:
    """iDLG's label for a single-image update: the class whose row of the last layer's weight
    gradient sums to the most negative value (None: the classifier was not sent, or the update
    is of more than one image)."""
    name = last_layer(obs)
    if name is None or obs.num_images != 1:
        return None
    return obs.target[name].sum(dim=1).argmin().reshape(1)


INITS = ("normal", "uniform")


def _init(obs: Observation, gen: torch.Generator, init: str) -> Tensor:
    """The dummy inputs: ``normal`` N(0, 1) (DLG's and Inverting Gradients' code,
    ``torch.randn``) or ``uniform`` on [0, 1) (iDLG's code and Fling's ``DLGAttacker``,
    ``torch.rand``); drawn first from the seed's generator, the soft labels' logits next."""
    shape = (obs.num_images, *obs.shape)
    if init == "normal":
        return torch.randn(shape, generator=gen)
    if init == "uniform":
        return torch.rand(shape, generator=gen)
    raise ValueError(f"init {init!r}: choose one of {', '.join(INITS)}")


OPTIMIZERS = {"lbfgs": ("LBFGS", 1.0), "adam": ("Adam", 1e-3)}  # torch.optim's name, its lr


def dlg(
    obs: Observation,
    *,
    iterations: int = 300,
    seed: int = 0,
    labels: Tensor | None = None,
    lr: float | None = None,
    init: str = "normal",
    optimizer: str = "lbfgs",
    distance: str = "l2",
    progress: Callable[[int, float], None] | None = None,
) -> tuple[Tensor, Tensor]:
    """DLG: L-BFGS on dummy inputs (and, without ``labels``, dummy soft labels) to match the
    observed gradient in squared distance. Returns (the inputs, the labels: argmax of the soft
    labels, or ``labels``). With ``labels`` from :func:`idlg_labels` this is iDLG.

    Options (defaults: the DLG paper's code): ``init``, the dummy inputs' distribution
    (:func:`_init`); ``optimizer`` ``lbfgs`` (lr 1) or ``adam`` (lr 1e-3, Fling's other
    backend); ``lr`` (None: the optimiser's); ``distance`` ``l2``, ``cosine`` (one cosine over
    all sent parameters, Inverting Gradients') or ``layer_cosine`` (Fling's ``'cos'``). With
    ``init='uniform'`` and the seed's global draw (``torch.manual_seed(seed)``) this is step for
    step Fling's ``DLGAttacker`` (``use_gt_labels=False``, ``tv_weight=0``) with the same
    ``optim_backend`` and ``distance_measure``, on the same target gradient
    (benchmarks/equivalence/run_fling_attack.py). ``progress(i, loss)`` after each iteration."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer {optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
    match = DISTANCES[distance]
    gen = torch.Generator().manual_seed(seed)
    x = _init(obs, gen, init).requires_grad_(True)
    free = labels is None
    y_logits = torch.randn((obs.num_images, obs.num_classes), generator=gen).requires_grad_(free)
    fixed = None if labels is None else nn.functional.one_hot(labels, obs.num_classes).float()
    name, default_lr = OPTIMIZERS[optimizer]
    opt_cls = getattr(torch.optim, name)  # looked up per call (the harness records its steps)
    opt = opt_cls([x, y_logits] if free else [x], lr=default_lr if lr is None else lr)

    def closure() -> Tensor:
        opt.zero_grad()
        y = torch.softmax(y_logits, -1) if fixed is None else fixed
        loss = match(dummy_gradient(obs, x, y), obs.target)
        loss.backward()
        return loss

    for i in range(iterations):
        loss = opt.step(closure)
        if progress is not None:
            progress(i, float(loss.detach()))
        if not torch.isfinite(loss):
            break
    found = y_logits.argmax(-1) if labels is None else labels
    return x.detach(), found.detach()


def inverting_gradients(
    obs: Observation,
    *,
    iterations: int = 1000,
    seed: int = 0,
    labels: Tensor | None = None,
    tv: float = 1e-4,
    lr: float = 0.1,
    progress: Callable[[int, float], None] | None = None,
    init: str = "normal",
) -> tuple[Tensor, Tensor]:
    """Inverting Gradients: Adam on the signed gradient of cosine distance + ``tv`` x total
    variation, learning rate decayed by 10 at 3/8, 5/8 and 7/8 of the iterations (as the
    paper's code). The dummy inputs' gradient is matched, or, where ``obs.unroll`` is given,
    the update of the client's local steps replayed on them (:func:`unrolled_update`, the
    paper's multi-step attack). Without ``labels`` the soft labels are optimised too. ``init``
    as for :func:`dlg`. Returns (inputs, labels)."""
    match = unrolled_update if obs.unroll is not None else dummy_gradient
    gen = torch.Generator().manual_seed(seed)
    x = _init(obs, gen, init).requires_grad_(True)
    free = labels is None
    y_logits = torch.randn((obs.num_images, obs.num_classes), generator=gen).requires_grad_(free)
    fixed = None if labels is None else nn.functional.one_hot(labels, obs.num_classes).float()
    opt = torch.optim.Adam([x, y_logits] if free else [x], lr=lr)
    marks = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=marks, gamma=0.1)
    for i in range(iterations):
        opt.zero_grad()
        y = torch.softmax(y_logits, -1) if fixed is None else fixed
        loss = cosine_distance(match(obs, x, y), obs.target)
        images = obs.as_images(x)
        if images is not None and tv > 0:
            loss = loss + tv * total_variation(images)
        loss.backward()
        assert x.grad is not None and (y_logits.grad is not None or not free)
        x.grad.sign_()
        if y_logits.grad is not None:
            y_logits.grad.sign_()
        opt.step()
        sched.step()
        if progress is not None:
            progress(i, float(loss.detach()))
    found = y_logits.argmax(-1) if labels is None else labels
    return x.detach(), found.detach()
