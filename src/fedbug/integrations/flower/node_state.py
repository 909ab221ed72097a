"""A node's per-client state on its own disk, so that a run resumed on new nodes (a restarted
simulation, a restarted SuperNode) goes on with the uninterrupted numbers.

Each version is the state a client left after training in a round (``client-I/rR.pt``, written
atomically, loaded with ``weights_only``). Training in round ``r`` starts from the newest version
of a round before ``r``; versions of round ``r`` and later belong to rounds the server is doing
again after a resume, and are dropped. Rounds are deterministic, so a version of a round done
before a kill equals the one the redo would write. The server resumes from its newest
checkpoint, written at most ``2 * checkpoint_every`` rounds before the newest round trained, so
a node keeps the versions of those rounds and the newest one before them.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import torch
from torch import Tensor

from fedbug.results import atomic_write_bytes

_VERSION = re.compile(r"^r(\d+)\.pt$")


class NodeStates:
    """The versions of each client's state under ``root`` (one folder a client)."""

    def __init__(self, root: Path | str, checkpoint_every: int) -> None:
        self.root = Path(root)
        self.window = 2 * max(1, int(checkpoint_every))

    def _folder(self, client: int) -> Path:
        return self.root / f"client-{int(client)}"

    def _versions(self, client: int) -> dict[int, Path]:
        folder = self._folder(client)
        if not folder.is_dir():
            return {}
        found = {}
        for p in folder.iterdir():
            m = _VERSION.match(p.name)
            if m:
                found[int(m.group(1))] = p
        return found

    def load(self, client: int, round: int) -> dict[str, Tensor] | None:
        """The state ``client`` left in its newest round before ``round``; None when it has
        none (it never trained here). Versions of ``round`` and later are dropped."""
        versions = self._versions(client)
        for r, path in versions.items():
            if r >= round:
                path.unlink(missing_ok=True)
        earlier = [r for r in versions if r < round]
        if not earlier:
            return None
        path = versions[max(earlier)]
        state = torch.load(io.BytesIO(path.read_bytes()), weights_only=True, map_location="cpu")
        return {str(k): v for k, v in state.items()}

    def save(self, client: int, round: int, state: dict[str, Tensor]) -> None:
        """Keep ``state`` as ``client``'s after ``round``; drop versions no resume can need."""
        folder = self._folder(client)
        folder.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        torch.save({k: v.detach().contiguous() for k, v in state.items()}, buf)
        atomic_write_bytes(folder / f"r{int(round):08d}.pt", buf.getvalue())
        versions = self._versions(client)
        old = [r for r in versions if r <= round - self.window]
        for r in old:
            if r != max(old):
                versions[r].unlink(missing_ok=True)
