"""Checkpoints: a header with the SHA-256 of the payload, checked on load, and a payload that
loads with ``torch.load(weights_only=True)`` only."""

from __future__ import annotations

import hashlib
import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from fedbug.errors import CheckpointError, first_line
from fedbug.results.files import atomic_write_bytes, read_regular

CHECKPOINT_MAGIC = b"FEDBUG-CHECKPOINT-1 "


def save_checkpoint_file(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically, after a header with its payload's SHA-256."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    atomic_write_bytes(path, CHECKPOINT_MAGIC + digest + b"\n" + payload)


def load_checkpoint_file(path: Path, limit: int | None = None) -> dict[str, Any]:
    """The checkpoint at ``path``, checked (header, SHA-256, tensors and plain data only);
    a file over ``limit`` bytes (:func:`~fedbug.results.limits.checkpoint_limit`: what the
    run's model could hold) is refused unread. Every refusal is a :class:`CheckpointError`."""
    fix = f"`fedbug repair {str(Path(path).parent)!r}` rebuilds it by running the rounds again"
    try:
        raw = read_regular(Path(path), limit, error=CheckpointError, fix=fix)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {e.strerror}") from None
    head, sep, payload = raw.partition(b"\n")
    if not sep or not head.startswith(CHECKPOINT_MAGIC):
        raise CheckpointError(f"{str(path)!r} is not a fedbug checkpoint (bad header)")
    expected = head[len(CHECKPOINT_MAGIC) :].decode("ascii", "replace")
    if hashlib.sha256(payload).hexdigest() != expected:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt (checksum mismatch); `fedbug repair "
            f"{str(Path(path).parent)!r}` rebuilds it by running the rounds again"
        )
    try:
        with warnings.catch_warnings():  # torch's notes on an unusual pickle: refused anyway
            warnings.filterwarnings("ignore", category=UserWarning, module="torch")
            return torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:  # torch's refusal of anything but tensors and plain data
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds objects other than tensors and plain data, which "
            "fedbug never writes; it was refused unread (nothing in it ran): delete it and run "
            "the config again with another --out"
        ) from None
    except Exception as e:  # noqa: BLE001 - any other loading failure is a bad file
        why = type(e).__name__ if "weights_only" in str(e) else first_line(e)
        raise CheckpointError(
            f"checkpoint {str(path)!r} cannot be loaded ({_printable(why)[:160]}); delete it and "
            "run the config again with another --out"
        ) from None


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
