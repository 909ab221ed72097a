"""One local SGD step of workload W's model, four ways, on one device (issue 34, item 3).

The sequential executor's step on a GPU is launch-bound (~3 ms for the standard CNN at batch 50,
``benchmarks/RESULTS.md``, "On a GPU"). This times what the two usual levers would give that
step before they are built into the executor: the same step eager, under ``torch.compile``
(inductor), under ``torch.compile(mode="reduce-overhead")`` (inductor with CUDA graphs), and
captured whole (forward, backward, SGD update) in one CUDA graph by hand and replayed. The
variants alternate over ``--reps`` repetitions of ``--steps`` steps each; medians are quoted as
milliseconds a step and as ratios to eager from the same repetitions.

    python -m benchmarks.gpu.step --device cuda --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from fedbug.models import build_model

BATCH = 50
SHAPE = (3, 32, 32)
CLASSES = 10
LR = 0.1
WEIGHT_DECAY = 1e-3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(mode: str, device: torch.device, seed: int) -> Callable[[], None]:
    """A closure running one SGD step of the standard CNN on a fixed NHWC batch."""
    model = build_model("standard_cnn", SHAPE, CLASSES, seed).to(device)
    model = model.to(memory_format=torch.channels_last)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, *SHAPE, generator=gen).to(device)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, CLASSES, (BATCH,), generator=gen).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    def loss_of(inp: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(inp), tgt)

    if mode == "eager":
        fwd: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = loss_of
    elif mode == "compile":
        fwd = torch.compile(loss_of)
    elif mode == "compile-reduce-overhead":
        fwd = torch.compile(loss_of, mode="reduce-overhead")
    elif mode == "cuda-graph":
        if device.type != "cuda":
            raise SystemExit("cuda-graph needs --device cuda")
        return captured_step(model, opt, x, y, device)
    else:
        raise SystemExit(f"unknown mode {mode!r}")

    def step() -> None:
        if mode == "compile-reduce-overhead":  # a new step: the graphs' outputs may be reused
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=False)
        fwd(x, y).backward()
        opt.step()

    return step


def captured_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device,
) -> Callable[[], None]:
    """The whole step captured once in a CUDA graph (PyTorch's "whole network capture")."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up on a side stream before capture, as documented
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return graph.replay


def timed(step: Callable[[], None], steps: int, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - t0) / steps * 1e3


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=200, help="steps a repetition (200)")
    ap.add_argument("--reps", type=int, default=5, help="alternating repetitions (5)")
    ap.add_argument(
        "--modes", default="eager,compile,compile-reduce-overhead,cuda-graph",
        help="comma-separated: eager, compile, compile-reduce-overhead, cuda-graph",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True  # the autotuned kernels, as deterministic: false
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    modes = args.modes.split(",")
    steps: dict[str, Callable[[], None]] = {}
    setup: dict[str, float] = {}
    failed: dict[str, str] = {}
    for m in modes:
        t0 = time.perf_counter()
        try:
            step = make_step(m, device, seed=0)
            for _ in range(5):  # compilation and cuDNN's autotuning happen here
                step()
            sync(device)
        except Exception as e:  # noqa: BLE001 - a lever that fails is reported, the rest timed
            failed[m] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            continue
        steps[m] = step
        setup[m] = time.perf_counter() - t0
    modes = list(steps)
    ms: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.reps):
        for m in modes:
            ms[m].append(timed(steps[m], args.steps, device))
    med = {m: statistics.median(v) for m, v in ms.items()}
    res: dict[str, Any] = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "batch": BATCH,
        "steps": args.steps,
        "reps": args.reps,
        "setup_s": setup,
        "ms_per_step": ms,
        "median_ms": med,
        "failed": failed,
    }
    if "eager" in med:
        res["ratio_to_eager"] = {m: med[m] / med["eager"] for m in modes}
    if args.json:
        print(json.dumps(res))
        return
    for m in modes:
        ratio = res.get("ratio_to_eager", {}).get(m, float("nan"))
        print(f"{m:26s} {med[m]:7.3f} ms/step  x{ratio:.2f} of eager  (setup {setup[m]:.1f} s)")
    for m, why in failed.items():
        print(f"{m:26s} failed: {why}")


if __name__ == "__main__":
    main()
