"""Independent pieces of GPU work side by side on CUDA streams (``cohort: {gradient: streams}``).

The cohort executor's vectorised gradient (``vmap``) turns each convolution with per-client
weights into one grouped convolution, which cuDNN serves with generic kernels; a client's own
gradient uses the ordinary kernels, which are fast but, at a small batch, too small to fill a
GPU. :class:`Lanes` runs client ``i``'s work on stream ``i mod width``, each stream first waiting
for the caller's stream and the caller's stream then waiting for all of them: the work of
different clients may overlap on the device, and what follows sees all of it. Captured in a CUDA
graph (``cuda_graphs``), the streams become the graph's parallel branches, replayed in one
launch. On a device without streams (the CPU) the pieces simply run one after another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

#: streams a :class:`Lanes` uses at most (clients beyond share them in turn)
WIDTH = 16


class Lanes:
    """Up to ``width`` CUDA streams of ``device`` (none off CUDA), made once and reused."""

    def __init__(self, device: torch.device, width: int = WIDTH) -> None:
        self.device = device
        self.width = width
        self._streams: list[torch.cuda.Stream] | None = None

    def streams(self, n: int) -> list[torch.cuda.Stream]:
        """The streams ``n`` pieces take: none off CUDA or for a single piece."""
        if self.device.type != "cuda" or n < 2:
            return []
        if self._streams is None:
            self._streams = [torch.cuda.Stream(self.device) for _ in range(self.width)]
        return self._streams[: min(n, self.width)]

    def map(self, body: Callable[[int], T], n: int) -> list[T]:
        """``[body(0), ..., body(n - 1)]``, piece ``i`` on stream ``i mod width``; the caller's
        stream waits for every piece before this returns (its results are then safe to read
        there, and the memory they were made in is not reused before)."""
        lanes = self.streams(n)
        if not lanes:
            return [body(i) for i in range(n)]
        here = torch.cuda.current_stream(self.device)
        for s in lanes:
            s.wait_stream(here)
        out = []
        for i in range(n):
            with torch.cuda.stream(lanes[i % len(lanes)]):
                out.append(body(i))
        for s in lanes:
            here.wait_stream(s)
        return out
