"""Recorded updates (``record_updates: [round, ...]``): what the server received from each
client in a chosen round, kept for the attack, in the run folder under ``updates/``.

``updates/round-<R>/global.pt`` holds the round's received weights (``{"weights": flat}``);
``updates/round-<R>/client-<K>.pt`` the client's sent parameters' deltas by name
(``delta.<name>``) and, for scoring only, its true inputs and labels of that round (``inputs``,
``labels``); ``client-<K>.json`` the rest (client, round, samples, local steps, learning rate,
the units sent and their parameters' names). The tensors are plain: they are saved with
``torch.save`` and loaded with ``torch.load(weights_only=True)``, which builds tensors and
containers only and refuses any other pickled object (a planted payload never runs). Files are
written atomically (:func:`fedbug.results.files.atomic_write_bytes`) and read only from
below the run folder, never through a link.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedbug.errors import ConfigError, first_line
from fedbug.results.files import atomic_write_bytes, check_no_links, read_regular
from fedbug.results.limits import MAX_UPDATE_META_BYTES, recorded_tensors_limit

FOLDER = "updates"
_NAME = re.compile(r"^client-(\d+)\.json$")


@dataclass
class RecordedUpdate:
    """One client's recorded update: ``deltas`` by parameter name (sent units only),
    ``received`` the round's global weights (flat), ``inputs``/``labels`` the truth for scoring
    (None where not recorded), ``meta`` the JSON side (client, round, num_samples, steps, lr,
    units_sent, params_sent)."""

    deltas: dict[str, Tensor]
    received: Tensor
    meta: dict[str, Any]
    inputs: Tensor | None = None
    labels: Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _tensor_bytes(tensors: dict[str, Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, buf)
    return buf.getvalue()


def round_dir(run: Path, round: int) -> Path:
    return Path(run) / FOLDER / f"round-{int(round)}"


def write_global(run: Path, round: int, weights: Tensor) -> None:
    """The round's received weights, once per round."""
    d = round_dir(run, round)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(d / "global.pt", _tensor_bytes({"weights": weights}))


def write_update(
    run: Path,
    meta: dict[str, Any],
    deltas: dict[str, Tensor],
    inputs: Tensor | None,
    labels: Tensor | None,
) -> None:
    """One client's update (``meta`` has ``round`` and ``client``) and its truth."""
    d = round_dir(run, meta["round"])
    d.mkdir(parents=True, exist_ok=True)
    tensors = {f"delta.{k}": v for k, v in deltas.items()}
    if inputs is not None and labels is not None:
        tensors.update(inputs=inputs, labels=labels)
    k = int(meta["client"])
    atomic_write_bytes(d / f"client-{k}.pt", _tensor_bytes(tensors))
    atomic_write_bytes(d / f"client-{k}.json", (json.dumps(meta, indent=1) + "\n").encode())


def tensors_limit(meta: dict[str, Any]) -> int:
    """The most bytes a tensor file of the update whose checked JSON side is ``meta`` (or of
    its round's ``global.pt``) may take (:func:`~fedbug.results.limits.recorded_tensors_limit`):
    the model's values, and its inputs and labels."""
    weights = sum(n for _, n in meta["received_names"].values())
    data = 2 * meta["num_images"] * math.prod(meta["input_shape"])
    return recorded_tensors_limit(weights + data, len(meta["received_names"]) + 3)


def load_tensors(run: Path, path: Path, limit: int | None = None) -> dict[str, Tensor]:
    """A recorded tensor file below ``run``: tensors only (``weights_only=True``); a file
    holding anything else, over ``limit`` bytes (:func:`tensors_limit`), or reached through a
    link, is a one-line :class:`ConfigError`."""
    check_no_links(Path(run), Path(path))
    fix = "record the round again (record_updates: [round, ...])"
    raw = read_regular(path, limit, error=ConfigError, fix=fix)
    try:
        out = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise ConfigError(f"{path} is not a recorded update (tensors only): {first_line(e)}") from e
    if not isinstance(out, dict) or not all(isinstance(v, Tensor) for v in out.values()):
        raise ConfigError(f"{path} is not a recorded update: expected a mapping of tensors")
    return out


def recorded(run: Path) -> dict[int, list[int]]:
    """The recorded rounds and, for each, its clients (sorted)."""
    base = Path(run) / FOLDER
    out: dict[int, list[int]] = {}
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        m = re.fullmatch(r"round-(\d+)", d.name)
        if m and d.is_dir() and not d.is_symlink():
            clients = sorted(int(c[1]) for f in d.iterdir() if (c := _NAME.match(f.name)))
            if clients:
                out[int(m[1])] = clients
    return out


#: the JSON side's keys the attack reads, each with what it must be
_META: dict[str, tuple[type | tuple[type, ...], str]] = {
    "client": (int, "a client index"),
    "steps": (int, "a positive count"),
    "num_images": (int, "a positive count"),
    "num_samples": (int, "a positive count"),
    "num_classes": (int, "a positive count"),
    "lr": ((int, float), "a finite number"),
    "model": (str, "a model name"),
    "model_options": (dict, "a mapping"),
    "received_names": (dict, "a mapping of name to [offset, size]"),
    "input_shape": (list, "a list of positive sizes"),
    "units_sent": (list, "a list of unit indices"),
}
#: the attack's dummy inputs (``num_images`` x the input's size) hold at most this many values
MAX_DUMMY_VALUES = 100_000_000


def _meta_problem(meta: Any) -> str | None:
    """What is wrong with a recorded update's JSON side (None: nothing the attack reads)."""
    if not isinstance(meta, dict):
        return "not a JSON object"
    for key, (kind, what) in _META.items():
        v: Any = meta.get(key)  # JSON: whatever the file holds
        bad = not isinstance(v, kind) or isinstance(v, bool)
        if not bad and what == "a positive count":
            bad = v < 1
        if not bad and isinstance(v, float):
            bad = not math.isfinite(v)
        if bad:
            return f"{key} is {v!r}, not {what}"
    pairs = list(meta["received_names"].values())
    if any(not isinstance(p, list) or len(p) != 2 for p in pairs):
        return "received_names maps each name to [offset, size]"
    ints = [*meta["input_shape"], *meta["units_sent"], *(x for p in pairs for x in p)]
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ints):
        return "input_shape, units_sent and received_names hold non-negative whole numbers only"
    if meta["num_images"] * math.prod(meta["input_shape"]) > MAX_DUMMY_VALUES:
        return f"num_images x input_shape is over {MAX_DUMMY_VALUES:,} values"
    if meta["num_classes"] > sum(n for _, n in pairs):  # a model holds a weight a class at least
        return "num_classes is more than the recorded weights hold"
    return None


def read_meta(path: Path) -> dict[str, Any]:
    """A recorded update's JSON side (``client-<K>.json``), checked; damage is one
    :class:`ConfigError` naming the file and the problem."""
    fix = "record the round again (record_updates: [round, ...])"
    problem: str | None
    try:
        raw = read_regular(path, MAX_UPDATE_META_BYTES, error=ConfigError, json_text=True, fix=fix)
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        meta, problem = None, f"not JSON ({type(e).__name__})"
    else:
        problem = _meta_problem(meta)
    if problem is not None:
        raise ConfigError(f"{path} is not a recorded update: {problem}; {fix}")
    return meta


def load_weights(run: Path, path: Path, limit: int | None = None) -> Tensor:
    """A round's recorded received weights (``global.pt``): one flat tensor."""
    w = load_tensors(run, path, limit).get("weights")
    if w is None or w.dim() != 1:
        raise ConfigError(f"{path} is not a round's recorded weights: expected one flat tensor")
    return w


def load_update(run: Path, round: int, client: int) -> RecordedUpdate:
    """Client ``client``'s recorded update of round ``round``."""
    d = round_dir(run, round)
    meta_path, tensors_path = d / f"client-{int(client)}.json", d / f"client-{int(client)}.pt"
    for path in (meta_path, tensors_path, d / "global.pt"):
        check_no_links(Path(run), path)
    meta = read_meta(meta_path)  # before the tensors: it bounds their files
    limit = tensors_limit(meta)
    tensors = load_tensors(run, tensors_path, limit)
    received = load_weights(run, d / "global.pt", limit)
    deltas = {k[len("delta.") :]: v for k, v in tensors.items() if k.startswith("delta.")}
    return RecordedUpdate(deltas, received, meta, tensors.get("inputs"), tensors.get("labels"))
