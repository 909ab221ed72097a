"""``cohort: {cuda_graphs: true}``: the cohort executor's vectorised gradient captured once per
shape in a CUDA graph and replayed, so that a group step launches one graph instead of the
gradient's hundred-odd kernels.

A step of a small model is bound by launching kernels, not by arithmetic (on an H100, W's
vmapped gradient of 10 clients took 6.40 ms eager and 3.56 ms captured: ``benchmarks/gpu``).
What is captured is a pure function of its tensor inputs (the group's stacked weights, its
batches and labels): a graph replays the same kernels on the same memory, so each call copies
its inputs into the buffers the capture read (:class:`StaticCall`) and reads the outputs the
capture wrote. One graph per key (the group's units, its number of clients, its batch shapes),
captured at the key's second call (a shape met once, such as a client's short last batch, runs
eagerly and costs no capture), up to :data:`MAX_GRAPHS`; beyond that a key runs eagerly (one
warning). An executor's graphs share one memory pool and one input buffer per shape: every
call copies its inputs in and its caller reads the outputs before the next replay, on one
stream, so no graph needs another's memory kept.

Anything else the function reads is fixed at capture: the model's structure, the loss, the
algorithm's parameters (FedDecorr's beta). An algorithm's ``extra_loss`` under the cohort
executor already sees only its parameters and one client's features (it runs inside the
vectorised map), which a graph keeps; in a graph its context carries no tensors (a read of one
fails at capture instead of reading memory freed since).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from fedbug.errors import ConfigError, first_line

#: graphs one executor keeps (each keeps its outputs in the shared pool: the cohort executor's,
#: a loss per client, its gradients going to one buffer outside it; beyond this, steps run
#: eagerly)
MAX_GRAPHS = 32
#: eager calls on a side stream before a capture (cuDNN's and cuBLAS's lazy set-up and
#: autotuning happen there, not inside the graph), as PyTorch's CUDA-graph notes advise
WARMUP_CALLS = 3

Outputs = Any  # a pytree of tensors
Capture = Callable[[Callable[[], Outputs]], tuple[Callable[[], None], Outputs]]


class GraphCaptureError(ConfigError):
    """A function the CUDA graph could not capture (the failing operation's error chained)."""


class CudaCapture:
    """Captures on one CUDA device, into one memory pool shared by its graphs; warm-up and
    capture on side streams of that device, replays on its current stream (``device: cuda:N``
    is not always the current device)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def __call__(self, fn: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs]:
        """Capture ``fn`` (which reads only tensors it keeps) after :data:`WARMUP_CALLS` eager
        calls; return the graph's replay and the tensors the capture wrote (overwritten by each
        replay). The capture runs no kernel: replay once for the first result."""
        dev, graph = self.device, torch.cuda.CUDAGraph()
        with torch.cuda.device(dev):
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    fn()
            torch.cuda.current_stream(dev).wait_stream(side)
            try:
                with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                    out = fn()
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # noqa: BLE001 - one line naming the failing operation
                cause = e.__context__ or e  # the end of capture's error hides the operation's
                raise GraphCaptureError(
                    f"cohort: cuda_graphs could not capture the vectorised gradient on {dev} "
                    f"({type(cause).__name__}: {first_line(cause)[:300]}); set cuda_graphs: "
                    "false (the same numbers, eagerly)"
                ) from cause

        def replay() -> None:
            with torch.cuda.device(dev):
                graph.replay()

        return replay, out


def capture_for(device: torch.device) -> Capture:
    """How calls on ``device`` are captured: a CUDA graph, only on a CUDA device."""
    if device.type != "cuda":
        raise ConfigError(
            f"cohort: {{cuda_graphs: true}} captures CUDA graphs, and this run's device is "
            f"{device}; set device: cuda on a machine with a CUDA GPU, or cuda_graphs: false"
        )
    return CudaCapture(device)


class StaticCall:
    """``fn`` captured on ``buffers`` (its inputs' shapes): each call copies its inputs there,
    replays, and returns the capture's outputs (valid until the next replay of any graph
    sharing their pool)."""

    def __init__(
        self, fn: Callable[..., Outputs], buffers: Sequence[Tensor], capture: Capture
    ) -> None:
        self.inputs = list(buffers)
        self.replay, self.outputs = capture(lambda: fn(*self.inputs))

    def __call__(self, *inputs: Tensor) -> Outputs:
        for buffer, t in zip(self.inputs, inputs, strict=True):
            buffer.copy_(t)
        self.replay()
        return self.outputs


class GraphCache:
    """One :class:`StaticCall` per key, made at the key's second call, at most ``limit``; the
    input buffers shared between keys of the same input shapes."""

    def __init__(self, capture: Capture, limit: int = MAX_GRAPHS) -> None:
        self.capture, self.limit = capture, limit
        self.calls: dict[Hashable, StaticCall] = {}
        self.uses: Counter[Hashable] = Counter()
        self.buffers: dict[tuple[Any, ...], Tensor] = {}
        self.eager_calls = 0  #: calls of keys beyond the limit, run without a graph

    def __call__(self, key: Hashable, fn: Callable[..., Outputs], *inputs: Tensor) -> Outputs:
        """``fn(*inputs)``, from the graph of ``key`` and the inputs' layout (shapes, strides,
        dtypes and alignment: a graph runs the kernels an eager call on the same layout runs,
        so its numbers are the eager call's to the bit)."""
        key = (key, tuple(layout(t) for t in inputs))
        call = self.calls.get(key)
        if call is None:
            self.uses[key] += 1
            if self.uses[key] < 2:  # a shape met once costs no capture
                return fn(*inputs)
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
            call = self.calls[key] = StaticCall(fn, self.buffers_for(inputs), self.capture)
        return call(*inputs)

    def clear(self) -> None:
        """Drop every graph (and its memory) and the uses counted: each key is captured again
        at its next second call (when what the graphs wrote into is replaced)."""
        self.calls.clear()
        self.uses.clear()

    def buffers_for(self, inputs: Sequence[Tensor]) -> list[Tensor]:
        """Buffers for ``inputs``, one per position and layout, made once (with the input's
        strides, as a channels_last batch's, and its alignment, as a group's rows past the
        first: kernels are chosen by both), holding their values: the warm-up and the capture
        run on real numbers (a label read from an unset buffer could be out of range, a
        device-side assert on a GPU)."""
        out = []
        for i, t in enumerate(inputs):
            k = (i, layout(t))
            if k not in self.buffers:
                self.buffers[k] = aligned_like(t)
            out.append(self.buffers[k].copy_(t))
        return out


#: the alignment in bytes a graph's input buffer repeats (a cache line: the widest vector
#: loads that choose kernels, on a CPU and on a GPU)
ALIGN = 64


def layout(t: Tensor) -> tuple[Any, ...]:
    """What of ``t`` besides its values chooses the kernels run on it."""
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.data_ptr() % ALIGN)


def aligned_like(t: Tensor) -> Tensor:
    """An uninitialised tensor of ``t``'s shape, strides and dtype whose first element has
    ``t``'s alignment (modulo :data:`ALIGN` bytes)."""
    size = t.element_size()
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n) if t.numel() else 0
    base = torch.empty(span + ALIGN // size, dtype=t.dtype, device=t.device)
    shift = (t.data_ptr() - base.data_ptr()) % ALIGN // size
    return base.as_strided(t.shape, t.stride(), storage_offset=shift)
