"""What a received run's recorded update may declare, from its run's own config.

A recorded update's JSON side (``updates/round-R/client-K.json``) is checked for its shape when
it is read (:func:`fedbug.results.updates.read_meta`); its numbers are checked here against what
the run's ``config.yaml`` could have produced, before the attack builds anything from them: its
local steps (the count the config's ``local_epochs``, ``batch_size`` and ``local_steps`` give a
client of its ``num_samples``, as the client's own loop counts them), its learning rate (the
config's ``lr``, decayed), its round, momentum and weight decay. Two limits bound what the
config cannot (a received ``config.yaml`` is no more trusted than the update):
:data:`MAX_CLIENT_SAMPLES`, and, for the unrolled replay (``--method ig-unrolled``), which
replays every local step and keeps each step's graph for the gradient of its dummy inputs,
:data:`MAX_UNROLLED_STEPS` and :data:`MAX_UNROLLED_SAMPLES`. Each refusal is one
:class:`~fedbug.errors.ConfigError` naming the file, the key and the limit.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedbug.errors import ConfigError

#: the most samples a recorded client may declare (the replay holds a label for each, and
#: ``--known-order`` a permutation of them): more than the largest built-in data set holds in
#: all (LEAF's Shakespeare, about 4.2 million)
MAX_CLIENT_SAMPLES = 10_000_000
#: the most local steps ``--method ig-unrolled`` replays: each iteration of the attack replays
#: them all, keeping each step's graph (1,000 steps of the digits MLP: 0.3 GB and 5 s an
#: iteration here; the privacy benchmarks' updates are 1-10 steps)
MAX_UNROLLED_STEPS = 10_000
#: the most samples ``--method ig-unrolled`` passes through the model an iteration (local steps
#: x the batch): their activations are kept for the gradient
MAX_UNROLLED_SAMPLES = 1_000_000
FIX = "record the round again (record_updates: [round, ...])"


def _number(v: Any) -> float | None:
    """``v`` as a finite float, or None (not a number, a boolean, or past a float's range)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        x = float(v)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _shown(v: Any) -> str:
    """``v`` for a message: its repr, cut to 40 characters (a 400-digit number is no line)."""
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _whole(v: Any, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _rate_problem(key: str, v: Any, cfg: Any) -> str | None:
    x = _number(v)
    if x is None or not 0 < x <= cfg.lr * (1 + 1e-9):
        within = f"(0, {cfg.lr:g}] (config.yaml's lr, decayed)"
        return f"{key} is {_shown(v)}, not a learning rate in {within}"
    return None


def _optional_problem(meta: dict[str, Any], cfg: Any) -> str | None:
    """The keys a recorded update may hold and the attack reads where it does."""
    if "round" in meta and not (_whole(meta["round"], 1) and meta["round"] <= cfg.rounds):
        return f"round is {_shown(meta['round'])}, not a round of the run's {cfg.rounds}"
    for key, low in (("clients", 1), ("first_client", 0)):
        if key in meta and not _whole(meta[key], low):
            return f"{key} is {_shown(meta[key])}, not a whole number of at least {low}"
    if "client_lr" in meta and (why := _rate_problem("client_lr", meta["client_lr"], cfg)):
        return why
    ranges: dict[str, tuple[float, float, str]] = {
        "momentum": (0.0, 1.0, "[0, 1)"),
        "weight_decay": (0.0, 1.0 + 1e-12, "[0, 1]"),
    }
    for key, (bottom, top, shown) in ranges.items():
        x = _number(meta.get(key, bottom))
        if x is None or not bottom <= x < top:
            return f"{key} is {_shown(meta[key])}, not a number in {shown}"
    if not isinstance(meta.get("augment", ""), str):
        return f"augment is {_shown(meta['augment'])}, not an augmentation's name"
    return None


def config_steps(cfg: Any, meta: dict[str, Any]) -> int:
    """The local steps the run's config gives the client of ``meta`` (its ``num_samples``), as
    its algorithm's client session counts them (FedRep's head epochs too)."""
    from fedbug.attack.unroll import open_session, recorded_task, run_algorithm, settings_of

    n = int(meta["num_samples"])
    session, _ = open_session(cfg, run_algorithm(cfg), recorded_task(cfg, meta), n)
    return int(session.local_step_count(n, settings_of(cfg))[0])


def counts_problem(cfg: Any, meta: dict[str, Any]) -> str | None:
    """What in a recorded update (its JSON side, shape-checked) the run's config ``cfg`` could
    not have produced, or None."""
    if why := _optional_problem(meta, cfg) or _rate_problem("lr", meta["lr"], cfg):
        return why
    n = meta["num_samples"]
    if n > MAX_CLIENT_SAMPLES:
        return f"num_samples is {n:,}, over the limit of {MAX_CLIENT_SAMPLES:,} a client"
    if meta["num_images"] > n:
        return f"num_images is {meta['num_images']:,}, more than the client's {n:,} samples"
    k = config_steps(cfg, meta)
    if meta["steps"] > k:
        how = f"local_epochs {cfg.local_epochs}, batch_size {cfg.batch_size}"
        if cfg.local_steps:
            how = f"local_steps {cfg.local_steps}"
        return (
            f"steps is {meta['steps']:,}, more than the {k:,} local steps config.yaml gives a "
            f"client of {n:,} samples ({how})"
        )
    return None


def check_counts(cfg: Any, meta: dict[str, Any], path: Path) -> None:
    """Refuse, in one line naming ``path`` (the update's JSON side), a recorded update whose
    numbers its run's config could not have produced (:func:`counts_problem`)."""
    if why := counts_problem(cfg, meta):
        raise ConfigError(f"{path} is not an update of this run: {why}; {FIX}")


def check_unrolled(cfg: Any, meta: dict[str, Any], path: Path) -> None:
    """Refuse, in one line naming ``path``, an update whose local steps ``--method
    ig-unrolled`` would replay past :data:`MAX_UNROLLED_STEPS` or
    :data:`MAX_UNROLLED_SAMPLES` an iteration."""
    steps = int(meta["steps"])
    rows = steps * min(cfg.batch_size, int(meta["num_samples"]))
    if steps > MAX_UNROLLED_STEPS:
        what = f"steps is {steps:,}, over the {MAX_UNROLLED_STEPS:,} local steps"
    elif rows > MAX_UNROLLED_SAMPLES:
        what = (
            f"steps x batch_size is {steps:,} x {cfg.batch_size:,}, over the "
            f"{MAX_UNROLLED_SAMPLES:,} samples an iteration"
        )
    else:
        return
    raise ConfigError(
        f"{path}: {what} that --method ig-unrolled replays (it keeps each step's graph); "
        "attack it as one scaled gradient with --method ig"
    )
