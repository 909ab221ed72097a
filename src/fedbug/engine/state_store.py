"""Per-client state out of core: a memory-mapped file under the run folder.

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

Only what a round reads or writes is in memory: records are copied out of and into the map, and
the mapped pages are dropped from the process (``madvise(MADV_DONTNEED)``; the data stays in
the file) whenever more than ``cache_bytes`` have been touched since the last drop.
"""

from __future__ import annotations

import json
import mmap
import shutil
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
    Whether it fits the run is the caller's to check, before the store's files are mapped
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
        cache_bytes: int = 64 << 20,
    ) -> None:
        self.folder = Path(folder)
        self.num_clients = num_clients
        self.layout = {k: tuple(v) for k, v in layout.items()}
        self.numels = [prod(s) for s in self.layout.values()]
        self.record = sum(self.numels)
        self.generation = generation
        self.cache_bytes = cache_bytes
        self._touched = 0
        self._maps: list[mmap.mmap] = []
        self.data = self._map(DATA, np.float32, num_clients * 2 * self.record)
        self.stamps = self._map(STAMPS, np.int64, num_clients * 2).reshape(num_clients, 2)

    def _map(self, name: str, dtype: type, count: int) -> np.ndarray:
        path = self.folder / name
        size = max(1, count) * np.dtype(dtype).itemsize
        with open(path, "r+b" if path.exists() else "w+b") as f:  # the map keeps its own fd
            if f.seek(0, 2) != size:
                f.truncate(size)  # sparse: unwritten records take no disk
            m = mmap.mmap(f.fileno(), size)
        self._maps.append(m)
        return np.frombuffer(m, dtype=dtype, count=count)

    # -- creating and opening ----------------------------------------------------------------
    @classmethod
    def create(
        cls, folder: Path, num_clients: int, example: dict[str, Tensor], **kw: int
    ) -> StateStore:
        """A new, empty store laid out like ``example`` (anything in ``folder`` is removed)."""
        folder = Path(folder)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        layout = {k: list(v.shape) for k, v in sorted(example.items())}
        text = json.dumps({"num_clients": num_clients, "fields": layout})
        (folder / LAYOUT).write_text(text, encoding="utf-8")
        return cls(folder, num_clients, {k: tuple(v) for k, v in layout.items()}, **kw)

    @classmethod
    def open(
        cls, folder: Path, generation: int, layout: Layout | None = None, **kw: int
    ) -> StateStore:
        """The store in ``folder`` as of checkpoint ``generation``: later writes are forgotten.
        ``layout``: its :func:`read_layout`, where the caller has read and checked it."""
        folder = Path(folder)
        num_clients, fields = layout if layout is not None else read_layout(folder)
        store = cls(folder, num_clients, fields, generation, **kw)
        store.stamps[store.stamps > generation] = 0
        return store

    # -- records -----------------------------------------------------------------------------
    def accepts(self, state: dict[str, Tensor]) -> bool:
        """Whether ``state`` has this store's keys, shapes and float32 values."""
        return sorted(state) == list(self.layout) and all(
            tuple(v.shape) == self.layout[k] and v.dtype == torch.float32 for k, v in state.items()
        )

    def _slice(self, client: int, slot: int) -> slice:
        start = (client * 2 + slot) * self.record
        return slice(start, start + self.record)

    def get(self, client: int) -> dict[str, Tensor] | None:
        """The client's latest state (copies), or ``None`` if it was never written."""
        s = self.stamps[client]
        if s[0] == 0 and s[1] == 0:
            return None
        flat = torch.from_numpy(self.data[self._slice(client, int(s[1] > s[0]))].copy())
        self._touch()
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
        dst = self.data[self._slice(client, slot)]
        off = 0
        for key, n in zip(self.layout, self.numels):
            dst[off : off + n] = state[key].detach().reshape(-1).numpy()
            off += n
        self.stamps[client, slot] = self.generation + 1
        self._touch()

    def written(self) -> np.ndarray:
        """The clients that hold a state."""
        return np.flatnonzero(self.stamps.max(axis=1) > 0)

    def commit(self) -> int:
        """Flush to disk and start a new generation; returns the committed generation."""
        for m in self._maps:
            m.flush()
        self.generation += 1
        return self.generation

    def _touch(self) -> None:
        self._touched += self.record * 4
        if self._touched > self.cache_bytes:
            self.release()

    def release(self) -> None:
        """Drop the mapped pages from this process's memory (the file keeps the data)."""
        self._touched = 0
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if advice is None:
            return
        for m in self._maps:
            m.madvise(advice)

    def close(self) -> None:
        for m in self._maps:
            m.flush()
        self.data = self.stamps = None  # type: ignore[assignment]  # release the buffers
        for m in self._maps:
            m.close()
        self._maps = []
