"""Checks of one client's update before the server aggregates it.

:func:`check_update` is the one gate every update passes, whatever executor produced it (the
in-process one today, a Flower executor's replies from other machines later): a malformed or
non-finite update is refused with a one-line reason instead of corrupting the global model.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fedbug.core.finite import non_finite_count
from fedbug.core.units import ParamSpace

#: Reasons that start with this are divergence (non-finite numbers), not a malformed reply.
NON_FINITE = "non-finite"


def check_update(result: Any, space: ParamSpace) -> str | None:
    """Why ``result`` (a :class:`~fedbug.engine.client.ClientResult`) cannot be aggregated, or None.

    Checked in order: the delta is a float tensor of ``space.total`` entries, ``trained`` and
    ``uploaded`` hold one flag per unit, ``num_samples`` is a positive integer, then the train
    loss (when reported) and the delta are finite. Reasons about non-finite numbers start with
    :data:`NON_FINITE`, so the caller can treat them as divergence.
    """
    delta = getattr(result, "delta", None)
    if not isinstance(delta, torch.Tensor):
        return f"delta is {type(delta).__name__}, not a tensor"
    if not delta.is_floating_point():
        return f"delta has dtype {delta.dtype}, not a float type"
    if tuple(delta.shape) != (space.total,):
        return f"delta has shape {tuple(delta.shape)}, expected ({space.total},)"
    for name in ("trained", "uploaded"):
        flags = getattr(result, name, None)
        if not isinstance(flags, list | tuple):
            return f"{name} is {type(flags).__name__}, not a list of flags"
        if len(flags) != space.num_units:
            return f"{name} has {len(flags)} flags, expected one per unit ({space.num_units})"
    n = getattr(result, "num_samples", None)
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return f"num_samples is {n!r}, expected a positive integer"
    loss = getattr(result, "train_loss", None)
    if loss is not None:
        try:
            value = float(loss)
        except (TypeError, ValueError):
            return f"train_loss is {loss!r}, not a number"
        if not math.isfinite(value):
            return f"{NON_FINITE} train loss ({value})"
    bad = non_finite_count(delta)
    if bad:
        return f"{NON_FINITE} weights ({bad} of {space.total} update entries are nan or inf)"
    return None


def is_divergence(reason: str) -> bool:
    """Whether a :func:`check_update` reason is about non-finite numbers."""
    return reason.startswith(NON_FINITE)


def divergence_hint(cfg: Any) -> str:
    """The likely cause of a diverged run and what to try, from its config."""
    dp = getattr(cfg, "dp", None)
    if dp is not None and dp.noise_multiplier > 0:
        return (
            f"under dp: the server adds noise of std {dp.noise_multiplier:g} x clip / (the "
            "expected clients a round) to every entry, likely too much for this model; lower "
            "dp.noise_multiplier or dp.clip, take more clients a round, or lower lr"
        )
    hint = f"the learning rate is likely too high (lr={cfg.lr:g})"
    fixes = ["lower lr"]
    if getattr(cfg, "clip_grad_norm", None) is None:
        fixes.append("set clip_grad_norm")
    fixes.append("or set on_divergence: skip_client to drop such updates")
    return f"{hint}; {', '.join(fixes)}"
