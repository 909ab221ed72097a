"""``cohort: {cuda_graphs: true}``: the cohort executor's vectorised gradient captured once per
shape in a CUDA graph and replayed, so that a group step launches one graph instead of the
gradient's hundred-odd kernels.

A step of a small model is bound by launching kernels, not by arithmetic (on an H100, W's
vmapped gradient of 10 clients took 6.40 ms eager and 3.56 ms captured: ``benchmarks/gpu``).
What is captured is a pure function of its tensor inputs (the group's stacked weights, its
batches and labels): a graph replays the same kernels on the same memory, so each call copies
its inputs into the buffers the capture read (:class:`StaticCall`) and reads the outputs the
capture wrote. One graph per key (the group's units, its number of clients, its batch shapes),
up to :data:`MAX_GRAPHS`; beyond that a key runs eagerly (one warning), as each graph keeps its
own activations' memory.

Anything else the function reads is fixed at capture: the model's structure, the loss, the
algorithm's parameters (FedDecorr's beta). An algorithm's ``extra_loss`` under the cohort
executor already sees only its parameters and one client's features (it runs inside the
vectorised map), which a graph keeps.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from fedbug.errors import ConfigError

#: graphs one executor keeps (each holds its own activations: a FedBug schedule with 5 units
#: and unequal last steps makes about a dozen keys; beyond this, steps run eagerly)
MAX_GRAPHS = 32
#: eager calls on a side stream before a capture (cuDNN's and cuBLAS's lazy set-up and
#: autotuning happen there, not inside the graph), as PyTorch's CUDA-graph notes advise
WARMUP_CALLS = 3

Outputs = Any  # a pytree of tensors
Capture = Callable[[Callable[[], Outputs]], tuple[Callable[[], None], Outputs]]


def cuda_capture(fn: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs]:
    """Capture ``fn`` (which reads only tensors it keeps) in a CUDA graph after
    :data:`WARMUP_CALLS` eager calls on a side stream; return the graph's replay and the
    tensors the capture wrote (overwritten by each replay). The capture runs no kernel: replay
    once for the first result."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def capture_for(device: torch.device) -> Capture:
    """How calls on ``device`` are captured: a CUDA graph, only on a CUDA device."""
    if device.type != "cuda":
        raise ConfigError(
            f"cohort: {{cuda_graphs: true}} captures CUDA graphs, and this run's device is "
            f"{device}; set device: cuda on a machine with a CUDA GPU, or cuda_graphs: false"
        )
    return cuda_capture


class StaticCall:
    """``fn`` captured on buffers of its inputs' shapes: each call copies its inputs there,
    replays, and returns the capture's outputs (valid until the next call)."""

    def __init__(
        self, fn: Callable[..., Outputs], inputs: Sequence[Tensor], capture: Capture
    ) -> None:
        self.inputs = [t.detach().clone() for t in inputs]
        self.replay, self.outputs = capture(lambda: fn(*self.inputs))

    def __call__(self, *inputs: Tensor) -> Outputs:
        for buffer, t in zip(self.inputs, inputs, strict=True):
            buffer.copy_(t)
        self.replay()
        return self.outputs


class GraphCache:
    """One :class:`StaticCall` per key, made at the key's first call, at most ``limit``."""

    def __init__(self, capture: Capture, limit: int = MAX_GRAPHS) -> None:
        self.capture, self.limit = capture, limit
        self.calls: dict[Hashable, StaticCall] = {}
        self.eager_calls = 0  #: calls of keys beyond the limit, run without a graph

    def __call__(self, key: Hashable, fn: Callable[..., Outputs], *inputs: Tensor) -> Outputs:
        call = self.calls.get(key)
        if call is None:
            if len(self.calls) >= self.limit:
                if not self.eager_calls:
                    warnings.warn(
                        f"cohort: cuda_graphs keeps {self.limit} graphs (one per group of "
                        "units, clients and batch shape), and this run makes more; the others "
                        "run without a graph",
                        stacklevel=2,
                    )
                self.eager_calls += 1
                return fn(*inputs)
            call = self.calls[key] = StaticCall(fn, inputs, self.capture)
        return call(*inputs)
