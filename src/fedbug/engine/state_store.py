"""Per-client state out of core: a sparse file under the run folder.

10,000 clients x a 1M-parameter model is 40 GB of FedDyn state, so a run with a run folder keeps
its clients' state (FedDyn's lambda_i, personal units ``local.<u>``: any fixed set of float32
tensors) in ``<run>/client_states/``:

* ``layout.json``: the state's keys and shapes (from the first state written);
* ``data.f32``: a sparse file of ``num_clients x 2`` slots of one record each (the fields, flat);
* ``stamps.i64``: per slot, the checkpoint generation it was written in (0: never written).

A client's current state is its slot with the higher stamp. A write goes to the slot that does
NOT hold the client's state as of the last checkpoint, so that version survives until the next
checkpoint; :meth:`StateStore.commit` (at each checkpoint) flushes the files and starts a new
generation, and :meth:`StateStore.open` with the checkpoint's generation forgets every slot
written after it: a resume sees exactly the states of the checkpoint's round. A client never
written reads as ``None`` (the caller's initial state).

Only what a round reads or writes is in memory: a record is read into a fresh buffer and written
from the state's own, each one read or write at its offset in ``data.f32`` (none of the file is
mapped into the process: its pages are the kernel's cache); the stamps, 16 bytes a client, are
memory-mapped. Writing a record through a map cost a page fault for each of its pages (a record
of the standard CNN's FedDyn state, 2.2 MiB, took 13-27 ms on a 2-core machine; one write, 1-3
ms: ``benchmarks/RESULTS.md``, "Client states written, not mapped").
"""

from __future__ import annotations

import io
import json
import mmap
import os
import shutil
import threading
from math import prod
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedbug.errors import CheckpointError
from fedbug.results.files import read_regular
from fedbug.results.limits import MAX_LAYOUT_BYTES

LAYOUT = "layout.json"
DATA = "data.f32"
STAMPS = "stamps.i64"


#: a store's layout: its clients, and the fields of a client's record by name with their shapes
Layout = tuple[int, dict[str, tuple[int, ...]]]
#: what to do with a store that does not fit its run
_FIX = "start the run again in another run folder (or remove this one)"


def read_layout(folder: Path) -> Layout:
    """``layout.json`` of the store in ``folder``: a regular file of at most
    :data:`~fedbug.results.limits.MAX_LAYOUT_BYTES` holding a count of clients (at least 1)
    and each field's shape (sizes of at least 0); else one :class:`CheckpointError` naming it.
    Whether it fits the run is the caller's to check, before the store's files are opened
    (a count of 10^12 clients made them that large)."""
    path = Path(folder) / LAYOUT
    try:
        raw = read_regular(path, MAX_LAYOUT_BYTES, error=CheckpointError, json_text=True, fix=_FIX)
        meta = json.loads(raw.decode("utf-8"))
    except OSError as e:
        raise CheckpointError(f"cannot read {str(path)!r} ({e.strerror}); {_FIX}") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        meta = None
    clients = meta.get("num_clients") if isinstance(meta, dict) else None
    fields = meta.get("fields") if isinstance(meta, dict) else None
    shapes_ok = isinstance(fields, dict) and all(
        isinstance(v, list) and all(type(d) is int and d >= 0 for d in v) for v in fields.values()
    )
    if type(clients) is not int or clients < 1 or not shapes_ok:
        raise CheckpointError(
            f"{str(path)!r} is not a client-state store's layout (num_clients and the fields' "
            f"shapes); {_FIX}"
        )
    return clients, {str(k): tuple(v) for k, v in fields.items()}  # type: ignore[union-attr]


class StateStore:
    """``num_clients`` records of the fields in ``layout`` (name -> shape), two slots each."""

    def __init__(
        self,
        folder: Path,
        num_clients: int,
        layout: dict[str, tuple[int, ...]],
        generation: int = 0,
    ) -> None:
        self.folder = Path(folder)
        self.num_clients = num_clients
        self.layout = {k: tuple(v) for k, v in layout.items()}
        self.numels = [prod(s) for s in self.layout.values()]
        self.record = sum(self.numels)
        self.generation = generation
        self._maps: list[mmap.mmap] = []
        #: ``data.f32``, unbuffered: a record is one read or write at its offset (under
        #: :attr:`_lock`: the file's position is shared)
        self.data = self._sized(DATA, 4 * num_clients * 2 * self.record)
        self._lock = threading.Lock()
        try:
            self.stamps = self._map(STAMPS, np.int64, num_clients * 2).reshape(num_clients, 2)
        except BaseException:
            self.data.close()
            raise

    def _sized(self, name: str, size: int) -> io.FileIO:
        """``name`` in the folder, opened to read and write, ``size`` bytes long (at least 1;
        made or cut to that size: sparse, unwritten records take no disk)."""
        path = self.folder / name
        f = io.FileIO(path, "r+" if path.exists() else "w+")
        try:
            if f.seek(0, 2) != max(1, size):
                f.truncate(max(1, size))
        except BaseException:
            f.close()
            raise
        return f

    def _map(self, name: str, dtype: type, count: int) -> np.ndarray:
        size = max(1, count) * np.dtype(dtype).itemsize
        with self._sized(name, size) as f:  # the map keeps its own descriptor
            m = mmap.mmap(f.fileno(), size)
        self._maps.append(m)
        return np.frombuffer(m, dtype=dtype, count=count)

    # -- creating and opening ----------------------------------------------------------------
    @classmethod
    def create(cls, folder: Path, num_clients: int, example: dict[str, Tensor]) -> StateStore:
        """A new, empty store laid out like ``example`` (anything in ``folder`` is removed)."""
        folder = Path(folder)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        layout = {k: list(v.shape) for k, v in sorted(example.items())}
        text = json.dumps({"num_clients": num_clients, "fields": layout})
        (folder / LAYOUT).write_text(text, encoding="utf-8")
        return cls(folder, num_clients, {k: tuple(v) for k, v in layout.items()})

    @classmethod
    def open(cls, folder: Path, generation: int, layout: Layout | None = None) -> StateStore:
        """The store in ``folder`` as of checkpoint ``generation``: later writes are forgotten.
        ``layout``: its :func:`read_layout`, where the caller has read and checked it."""
        folder = Path(folder)
        num_clients, fields = layout if layout is not None else read_layout(folder)
        store = cls(folder, num_clients, fields, generation)
        store.stamps[store.stamps > generation] = 0
        return store

    # -- records -----------------------------------------------------------------------------
    def accepts(self, state: dict[str, Tensor]) -> bool:
        """Whether ``state`` has this store's keys, shapes and float32 values."""
        return sorted(state) == list(self.layout) and all(
            tuple(v.shape) == self.layout[k] and v.dtype == torch.float32 for k, v in state.items()
        )

    def _offset(self, client: int, slot: int) -> int:
        """Where the record of ``client``'s ``slot`` begins in ``data.f32``, in bytes."""
        return (int(client) * 2 + slot) * self.record * 4

    def get(self, client: int) -> dict[str, Tensor] | None:
        """The client's latest state (copies), or ``None`` if it was never written."""
        s = self.stamps[client]
        if s[0] == 0 and s[1] == 0:
            return None
        buf = np.empty(self.record, dtype=np.float32)
        with self._lock:
            self.data.seek(self._offset(client, int(s[1] > s[0])))
            _read_all(self.data, buf.data.cast("B"))
        flat = torch.from_numpy(buf)
        out: dict[str, Tensor] = {}
        off = 0
        for (key, shape), n in zip(self.layout.items(), self.numels):
            out[key] = flat[off : off + n].view(shape)
            off += n
        return out

    def put(self, client: int, state: dict[str, Tensor]) -> None:
        """Write the client's state, keeping its version as of the last checkpoint."""
        if not self.accepts(state):
            raise ValueError(f"state of client {client} does not fit the store's layout")
        s = self.stamps[client]
        committed = [k for k in (0, 1) if 0 < s[k] <= self.generation]
        # keep the newest committed slot; write the other one
        keep = max(committed, key=lambda k: s[k]) if committed else 1
        slot = 1 - keep
        # contiguous: a 1-D view with gaps stays one under reshape, and is written as a copy
        fields = [state[key].detach().contiguous().reshape(-1).numpy() for key in self.layout]
        self.stamps[client, slot] = 0  # a write that fails partway leaves the slot unread
        with self._lock:
            self.data.seek(self._offset(client, slot))
            for field in fields:  # the layout's order: one record, back to back
                _write_all(self.data, field.data.cast("B"))
        self.stamps[client, slot] = self.generation + 1

    def written(self) -> np.ndarray:
        """The clients that hold a state."""
        return np.flatnonzero(self.stamps.max(axis=1) > 0)

    def commit(self) -> int:
        """Flush to disk (the records first, then the stamps that point at them) and start a
        new generation; returns the committed generation."""
        os.fsync(self.data.fileno())
        for m in self._maps:
            m.flush()
        self.generation += 1
        return self.generation

    def close(self) -> None:
        """Close the files (what was written is in them; :meth:`commit` makes it durable)."""
        for m in self._maps:
            m.flush()
        self.data.close()
        self.stamps = None  # type: ignore[assignment]  # release the map's buffer
        for m in self._maps:
            m.close()
        self._maps = []


def _write_all(f: io.FileIO, data: memoryview) -> None:
    """Write all of ``data`` at ``f``'s position (a raw write may take only part of it)."""
    while len(data):
        n = f.write(data)
        if not n:
            raise OSError(f"cannot write to {f.name!r}")
        data = data[n:]


def _read_all(f: io.FileIO, into: memoryview) -> None:
    """Fill ``into`` from ``f``'s position (a raw read may return only part of it); a file that
    ends before is one :class:`CheckpointError`."""
    while len(into):
        n = f.readinto(into)
        if not n:
            raise CheckpointError(f"{str(f.name)!r} ends inside a client's record; {_FIX}")
        into = into[n:]
