"""Checkpoints: a header with the SHA-256 of the payload, checked on load, and a payload that
loads with ``torch.load(weights_only=True)`` only, after the CRC-32 of each of its zip records
(torch writes them and never reads them back: a damaged weight would load as another value)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from fedbug.errors import CheckpointError, first_line
from fedbug.results.files import atomic_write_bytes, read_regular

CHECKPOINT_MAGIC = b"FEDBUG-CHECKPOINT-1 "
ZIP_MAGIC = b"PK\x03\x04"  # a zip's first record: torch.save's format since torch 1.6


def save_checkpoint_file(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically, after a header with its payload's SHA-256."""
    buf = io.BytesIO()
    with _crc32_computed():
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
        raise CheckpointError(f"{str(path)!r} is not a fedbug checkpoint (bad header); {fix}")
    expected = head[len(CHECKPOINT_MAGIC) :].decode("ascii", "replace")
    if hashlib.sha256(payload).hexdigest() != expected:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt (checksum mismatch); {fix}")
    _check_zip(payload, path, fix)
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
        hostile = "weights_only" in str(e)
        why = type(e).__name__ if hostile else first_line(e)
        way = "delete it and run the config again with another --out" if hostile else fix
        raise CheckpointError(
            f"checkpoint {str(path)!r} cannot be loaded ({_printable(why)[:160]}); {way}"
        ) from None


def _crc32_computed() -> contextlib.AbstractContextManager[Any]:
    """torch.save with the CRC-32s the load checks, even where the process turned them off
    (torch's ``torch.utils.serialization.config.save.compute_crc32``, since torch 2.6; before
    it, they were always computed)."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return contextlib.nullcontext()
    # a config module torch installs at run time: its stub has no patch()
    return config.patch({"save.compute_crc32": True})  # type: ignore[attr-defined]


def _check_zip(payload: bytes, path: Path, fix: str) -> None:
    """Refuse a payload that is not a whole zip whose records match their CRC-32s (what
    torch.save writes), before torch reads it: its reader checks no CRC, so a changed byte of a
    weight or of the pickle loaded as another value or object. The records are read a MiB at a
    time, not copied whole."""
    if not payload.startswith(ZIP_MAGIC):
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt (its payload is not torch's zip format, which "
            f"fedbug writes) and was refused unread; {fix}, or delete it and run the config "
            "again with another --out"
        )
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as zf:
            for info in zf.infolist():
                with zf.open(info) as record:
                    while record.read(1 << 20):
                        pass
    except Exception as e:  # noqa: BLE001 - zipfile's refusals are of many kinds: all damage
        why = _printable(first_line(e))[:160]
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt (its zip payload is damaged: {why}); {fix}"
        ) from None


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
