"""Where a run computes (``device: auto | cpu | cuda | cuda:N | mps``), in what precision
(``precision: fp32 | tf32 | bf16 | fp16``) and whether its GPU kernels are deterministic.

``auto`` is CUDA when torch sees a CUDA device, else the CPU. The device is left out of the
config hash, so a run resumes on another device (its numbers then agree to rounding, not bit
for bit). Master weights always stay float32 in the flat vector; ``bf16``/``fp16`` autocast the
forward pass and the loss (``fp16`` with a gradient scaler, on a GPU only). ``fp32`` is IEEE
float32 everywhere: on a GPU, TensorFloat-32 (which PyTorch's cuDNN convolutions use by default
on Ampere and later) is turned off; ``tf32`` turns it on for matrix products and convolutions.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from fedbug.errors import ConfigError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: cuBLAS's setting for reproducible matrix products (NVIDIA's cuBLAS docs, "Results
#: reproducibility"); PyTorch refuses deterministic mode on CUDA >= 10.2 without it.
CUBLAS_DETERMINISTIC = ":4096:8"


def resolve_device(name: str) -> torch.device:
    """The torch device ``name`` means here; a ConfigError naming the fix when it is absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device: {name} asked for, but torch sees no CUDA device here (torch "
                f"{torch.__version__}); use device: cpu, or auto to take a GPU where there is one"
            )
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"device: {name} asked for, but this machine has {torch.cuda.device_count()} "
                "CUDA device(s); count from cuda:0"
            )
        return torch.device("cuda", index)
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(
                "device: mps asked for, but torch sees no Apple GPU here; use device: cpu"
            )
        return torch.device("mps")
    raise ConfigError(f"device: {name!r} is not one of auto, cpu, cuda, cuda:N, mps")


def check_precision(device: torch.device, precision: str) -> None:
    """Refuse a precision the device cannot run."""
    if precision == "tf32" and device.type != "cuda":
        raise ConfigError(
            f"precision: tf32 is NVIDIA GPUs' TensorFloat-32 (Ampere and later), not on "
            f"{device.type}; use fp32 (the same storage, full float32 products) or bf16"
        )
    if precision == "fp16" and device.type == "cpu":
        raise ConfigError(
            "precision: fp16 needs a GPU (its gradient scaler is CUDA's); on a CPU use bf16"
        )
    if precision == "bf16" and device.type == "cpu":
        problem = cpu_bf16_problem()
        if problem is not None:
            raise ConfigError(f"precision: bf16 cannot run on this CPU: {problem}")


_BF16_PROBE = """
import torch
last = torch.channels_last
for m, x in ((torch.nn.Linear(256, 256), torch.randn(64, 256)),
             (torch.nn.Conv2d(3, 16, 3), torch.randn(8, 3, 32, 32).contiguous(memory_format=last)),
             (torch.nn.Conv2d(1, 8, 3), torch.randn(16, 1, 8, 8).contiguous(memory_format=last))):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    y.float().sum().backward()
"""  # shapes big enough for oneDNN to pick its fastest (AMX) kernels, as training does


@functools.cache
def cpu_bf16_problem() -> str | None:
    """Why bf16 autocast cannot run on this CPU, or None. Found once, in a child process: a CPU
    that advertises AMX which the machine does not enable (seen in a VM here) kills a process
    with an illegal instruction at the first bf16 kernel, and no flag says so beforehand."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _BF16_PROBE],
            capture_output=True,
            text=True,
            timeout=300,
            env=os.environ.copy(),
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"the bf16 probe could not run ({e}); use precision: fp32"
    if done.returncode == 0:
        return None
    if done.returncode == -signal.SIGILL:
        return (
            "its bf16 kernels die with an illegal instruction (the CPU advertises AMX or "
            "AVX512-BF16 that this machine does not run, as in some VMs); start Python with "
            "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 set, or use precision: fp32"
        )
    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return f"a bf16 probe failed ({last}); use precision: fp32"


def describe(device: torch.device) -> str:
    """The device as a person reads it (``cuda:0 (NVIDIA H100 80GB HBM3)``, ``cpu (x86_64)``)."""
    if device.type == "cuda":
        index = device.index or 0
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    if device.type == "cpu":
        return f"cpu ({platform.machine() or 'unknown'})"
    return str(device)


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """The forward pass and loss in ``precision`` (a no-op for fp32)."""
    if precision not in DTYPES:  # fp32, tf32: float32 tensors
        yield
        return
    with torch.autocast(device_type=device.type, dtype=DTYPES[precision]):
        yield


def memory_bytes(device: torch.device) -> int | None:
    """The memory of a GPU in bytes (an Apple GPU's recommended working set), None for the CPU
    and devices without memory of their own (``meta``)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device.index or 0).total_memory)
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory())
    return None


def from_host(t: Tensor, device: torch.device) -> Tensor:
    """``t``, a tensor on the host, on ``device`` without the host waiting for the work queued
    there. A plain ``t.to("cuda")`` copies from pageable memory and then waits for the stream
    to drain, so in a path taken every step the CPU can no longer run ahead of the GPU (each
    step's Python then adds to its kernels' time instead of hiding under it). On CUDA the bytes
    go through pinned memory (PyTorch's caching host allocator keeps it until the copy is done)
    with ``non_blocking``, ordered on the current stream like any kernel; elsewhere ``t.to``.
    The pinned copy is always a copy (of an already pinned ``t`` too: the caller may change
    ``t`` before the device has read it), laid out as ``t`` where that is dense, else
    contiguously (a view with gaps, or an expanded tensor, cannot be pinned as it is)."""
    if device.type != "cuda" or t.device.type != "cpu" or t.layout != torch.strided:
        return t.to(device)
    if not dense_strides(t.shape, t.stride()):
        t = t.contiguous()
    elif t.is_pinned():
        t = t.clone()
    return t.pin_memory().to(device, non_blocking=True)


def take_rows(t: Tensor, idx: Tensor) -> Tensor:
    """``t[idx]`` for a tensor of row indices, as fast as it can be read: ``index_select``
    where ``t`` is contiguous (the same rows in the same layout; advanced indexing copies
    element by element, ~5x slower for a client's 500 uint8 CIFAR images on one CPU core:
    ``python -m benchmarks.scale.per_client``),
    the indices moved to ``t``'s device through :func:`from_host` (indexing a GPU tensor with
    host indices waits for the GPU). Anything else (a mask, a single index, a strided ``t``):
    ``t[idx]``."""
    rows = isinstance(idx, Tensor) and idx.dtype == torch.long and idx.dim() == 1
    if not rows or not t.is_contiguous():
        return t[idx]
    return t.index_select(0, from_host(idx, t.device))  # on its device already: as it is


def dense_strides(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether ``strides`` lay out ``shape`` without gaps or overlaps (its axes in some order;
    axes of size 1 have no say)."""
    expected = 1
    for size, stride in sorted((p for p in zip(shape, strides) if p[0] != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor in it (dicts, lists, tuples) on ``device``; the same objects
    where they are there already. A host tensor reaches a CUDA device through :func:`from_host`
    (a client's state and a round's payload at a client's opening: no wait for the device's
    queue); one on the device comes back with ``.to`` (the host reads it next: that waits)."""
    if isinstance(obj, torch.Tensor):
        return from_host(obj, device)
    if isinstance(obj, dict):
        moved = {k: to_device(v, device) for k, v in obj.items()}
        return obj if all(moved[k] is v for k, v in obj.items()) else moved
    if isinstance(obj, list | tuple):
        items = [to_device(v, device) for v in obj]
        return obj if all(a is b for a, b in zip(items, obj, strict=True)) else type(obj)(items)
    return obj


def configure_kernels(device: torch.device, precision: str, deterministic: bool) -> dict[str, Any]:
    """Set torch's process-wide kernel choices for a run on ``device`` (as fedbug sets torch's
    thread count) and return them for the run's record. On a CUDA device: TensorFloat-32 for
    matrix products and cuDNN only under ``precision: tf32``; with ``deterministic``, cuDNN's
    deterministic algorithms without autotuning, PyTorch's deterministic implementations (a
    warning names any operation that has none) and cuBLAS's reproducible workspace (unless
    ``CUBLAS_WORKSPACE_CONFIG`` is set already); without, cuDNN autotunes (``benchmark``). Other
    devices compute deterministically for a given thread count and are left as they are."""
    if device.type != "cuda":
        return {}
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    return {
        "deterministic": deterministic,
        "tf32": tf32,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


def _tf32_flags() -> tuple[bool, bool] | None:
    """torch's TF32 flags (matrix products, cuDNN), or None where they cannot be read (torch
    refuses the old getters once a program has set conv and RNN apart with the new API)."""
    try:
        return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    except RuntimeError:
        return None


@contextlib.contextmanager
def process_settings_kept() -> Iterator[None]:
    """torch's process-wide settings that a run changes (its thread count; on a GPU the kernel
    flags of :func:`configure_kernels` and ``CUBLAS_WORKSPACE_CONFIG``) put back as they were
    when the run ends, so ``fedbug.run`` leaves a user's process as it found it."""
    threads = torch.get_num_threads()
    tf32 = _tf32_flags()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    algos = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if tf32 is not None and _tf32_flags() != tf32:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        torch.use_deterministic_algorithms(algos, warn_only=warn_only)
        if cublas is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas


#: FLOPs of one training step (forward and backward of a batch) under which a CPU run that sets
#: no ``threads`` uses one torch thread: a second thread buys nothing on such small steps (the
#: digits demos: 5.6 MFLOP a step, 8.0 s at 1 thread, 8.0-9.3 s at 2) and stalls when another
#: process holds a core (10.5 s against 23.0 s beside a busy loop); workload W (4.0 GFLOP a step)
#: trains 1.5x faster on 2 threads than on 1 (``benchmarks/threads/``).
SMALL_STEP_FLOPS = 1e8


def default_threads(step_flops: float | None, cores: int) -> int:
    """Torch threads for a CPU run whose config sets none: 1 where one training step costs less
    than :data:`SMALL_STEP_FLOPS`, else every core (also where the step could not be counted)."""
    if step_flops is not None and step_flops < SMALL_STEP_FLOPS:
        return 1
    return max(1, cores)
