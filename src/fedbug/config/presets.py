"""``method:`` presets (FreezeFL's and FedSeq's settings by name) filled into a config document,
and the options blocks a sweep's grid may use."""

from __future__ import annotations

from typing import Any

from fedbug.algorithms import ALGORITHMS
from fedbug.config.compat import owners
from fedbug.core.registry import unknown_name_message
from fedbug.errors import ConfigError

# ``method:`` presets: a name -> the keys it sets. Keys the config sets itself win. A method that
# is an algorithm's name just selects that algorithm.
_FREEZING = {"policy": "freezefl", "aggregation": "layerwise", "upload": "partial"}
PRESETS: dict[str, dict[str, Any]] = {
    # FreezeFL Table III (the system: block comes from the config)
    "freezing": _FREEZING,
    "freezing_cs": {**_FREEZING, "selection": "reputation", "reputation": {"warm_restart": 0}},
    "freezefl": {**_FREEZING, "selection": "reputation"},
    "rbcsf": {"algorithm": "fedavg", "selection": "rbcsf"},
    # FreezeFL Table IV: Fjord (K uniform, as FedAvg) and Fjord with reputation selection
    "fjord": {"algorithm": "fjord", "selection": "uniform"},
    "fjord_cs": {
        "algorithm": "fjord",
        "selection": "reputation",
        "reputation": {"warm_restart": 0},
    },
    "local": {"algorithm": "local", "evaluation": "personalized"},
    # FedBug itself: bottom-up gradual unfreezing (bottom_up.gu_ratio, 0.4 by default) on FedAvg
    "fedbug": {"policy": "bottom_up"},
    # the partial-training family (issue 30); Fling trains FedPart with Adam lr 1e-3, which a
    # preset does not impose on a config that sets its own lr
    "fedpart": {"policy": "fedpart", "aggregation": "layerwise", "upload": "partial"},
    # CoCoFL's Algorithm 2: each key averaged over all participants, a frozen one unchanged
    # HeteroFL's combine is a plain mean and its Local.train clips gradients to norm 1
    "heterofl": {"algorithm": "heterofl", "weighting": "uniform", "clip_grad_norm": 1.0},
    "fedrolex": {"algorithm": "fedrolex", "weighting": "uniform", "clip_grad_norm": 1.0},
    # SLT's embedd_submodel + model_averaging: a plain mean per entry over the holders
    "slt": {"algorithm": "slt", "weighting": "uniform"},
    "cocofl": {
        "policy": "cocofl",
        "aggregation": "full",
        "weighting": "uniform",
        "upload": "partial",
    },
    "fedseq-vanilla": {"algorithm": "fedbabu", "schedule": "vanilla", "evaluation": "personalized"},
    "fedseq-anti": {"algorithm": "fedbabu", "schedule": "anti", "evaluation": "personalized"},
}


def preset_of(method: str) -> dict[str, Any] | None:
    """The keys ``method`` sets: its preset's, or an algorithm's name (with ``evaluation:
    personalized`` where it keeps part of every model on its clients: the only evaluation it
    has); None if unknown."""
    if method in PRESETS:
        return PRESETS[method]
    if method not in ALGORITHMS:
        return None
    if not ALGORITHMS.get(method).has_global_model:
        return {"algorithm": method, "evaluation": "personalized"}
    return {"algorithm": method}


def apply_method(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with its ``method`` preset's keys filled in where the document is silent."""
    method = doc.get("method")
    if method is None:
        return doc
    if not isinstance(method, str):
        raise ConfigError(f"method must be a name; got {method!r}")
    preset = preset_of(method)
    if preset is None:
        raise ConfigError(
            unknown_name_message("method", method, sorted({*PRESETS, *ALGORITHMS.names()}))
        )
    for key in DEFINING:
        if key in preset and doc.get(key) is not None and doc[key] != preset[key]:
            raise ConfigError(
                f"method: {method} sets {key}: {preset[key]}, but the config sets {key}: "
                f"{doc[key]}; remove one of the two (e.g. -s {key}={preset[key]} with the method)"
            )
    return _merge(preset, doc)


# the keys that say which method runs: a preset and its config must not disagree on them (other
# keys of a preset are defaults the config may change)
DEFINING = ("algorithm", "policy", "schedule", "selection")


def method_over_file(doc: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a config file's) as a ``method`` given on the command line (``given``: the
    ``-s`` overrides) replaces the file's choice of method: the keys that say which method runs
    (:data:`DEFINING`) and the options blocks of the methods that then no longer run are
    dropped, but for those the command line sets itself, and the blocks of the methods the file's
    ``grid:`` names. ``-s method=slt`` on a config that runs FedBug (``policy: bottom_up`` and
    its ``bottom_up:`` block) runs SLT as its preset says, as any ``-s`` wins over the file;
    ``-s method=slt -s policy=bottom_up`` composes the two with the file's block. The rest of
    the file (``system:``, ``dp:``, ...) stays. A method that is not a known name drops nothing."""
    method = given.get("method")
    preset = preset_of(method) if isinstance(method, str) else None
    if preset is None:  # not a name, or unknown: apply_method says so
        return doc
    runs = {given.get(k, preset.get(k)) for k in DEFINING} | set(preset)
    kept = runs | grid_blocks(doc.get("grid") or {})
    touched = {k.split(".")[0] for k in given}
    drop = {k for k in DEFINING if k not in given}
    drop |= {b for b in owners() if b not in kept and b not in touched}
    return {k: v for k, v in doc.items() if k not in drop}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def grid_blocks(grid: Any) -> frozenset[str]:
    """The options blocks a grid's cells may use: those of the methods it names, as values
    (``algorithm: [fedavg, fedprox]``, a ``method:`` preset's), as keys (``fedprox.mu``) or in
    a cell's mapping (``{policy: bottom_up, bottom_up.gu_ratio: 0.5}``)."""
    words: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                words.add(str(k).split(".")[0])
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)
        elif isinstance(x, str) and x not in words:
            words.add(x)
            if x in PRESETS:
                walk(PRESETS[x])

    walk(grid)
    return frozenset(b for b in owners() if b in words)
