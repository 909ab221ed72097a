"""The gradient of C clients' standard CNN at once, four ways, on one device (issue 34).

The cohort executor takes ``vmap(grad(functional_call))``; ``vmap`` turns each convolution with
per-client weights into one grouped convolution, which cuDNN serves with slow generic kernels on
an H100 (``results/h100-2026-11-27/w-profile.txt``). This times, for C clients of batch 50 on
3x32x32, each client's gradient of its cross-entropy:

- ``vmap``: what the executor does;
- ``bmm``: convolutions written as unfold (im2col) and a batched matrix product over clients,
  the whole forward batched by hand, one ``autograd.grad`` of the clients' summed losses;
- ``loop``: C ordinary single-client gradients, one after another (the sequential kernels);
- ``streams``: the same C gradients side by side on up to 16 CUDA streams
  (``cohort: {gradient: streams}``, :class:`fedbug.engine.executors.streams.Lanes`);
- ``vmap-graph``, ``bmm-graph``, ``loop-graph`` and ``streams-graph``: those captured once in a
  CUDA graph and replayed (the streams as the graph's parallel branches).

It checks that ``bmm`` gives ``vmap``'s gradients (to float32 rounding) before timing.

    python -m benchmarks.gpu.cohort_forms --device cuda --clients 10,100 --json
    python -m benchmarks.gpu.cohort_forms --device cuda --tf32   # TensorFloat-32 kernels
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
from torch import Tensor
from torch.func import functional_call, grad, vmap

from fedbug.engine.executors.streams import Lanes
from fedbug.models import build_model

BATCH, SHAPE, CLASSES = 50, (3, 32, 32), 10


def conv_bmm(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """Per-client valid convolution: x [C, B, I, H, W], w [C, O, I, k, k], b [C, O]."""
    c, n, i, h, wd = x.shape
    o, k = w.shape[1], w.shape[-1]
    cols = F.unfold(x.reshape(c * n, i, h, wd), k)  # [C*B, I*k*k, L]
    ho, wo = h - k + 1, wd - k + 1
    cols = cols.view(c, n, i * k * k, ho * wo).transpose(1, 2).reshape(c, i * k * k, n * ho * wo)
    out = torch.baddbmm(b.unsqueeze(2), w.reshape(c, o, i * k * k), cols)  # [C, O, B*L]
    return out.view(c, o, n, ho, wo).transpose(1, 2)  # [C, B, O, ho, wo]


def pool(x: Tensor) -> Tensor:
    c, n = x.shape[:2]
    return F.max_pool2d(x.flatten(0, 1), 2).unflatten(0, (c, n))


def forward_bmm(p: dict[str, Tensor], x: Tensor) -> Tensor:
    """The standard CNN on x [C, B, 3, 32, 32] with each client's parameters p[...][c]."""
    h = pool(F.relu(conv_bmm(x, p["conv1.weight"], p["conv1.bias"])))
    h = pool(F.relu(conv_bmm(h, p["conv2.weight"], p["conv2.bias"])))
    h = h.flatten(2)  # [C, B, 1600]
    for name, act in (("fc1", True), ("fc2", True), ("fc3", False)):
        h = torch.baddbmm(p[name + ".bias"].unsqueeze(1), h, p[name + ".weight"].transpose(1, 2))
        h = F.relu(h) if act else h
    return h


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--clients", default="10,100")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--forms", default="vmap,bmm,loop,streams,vmap-graph,bmm-graph,loop-graph,streams-graph"
    )
    ap.add_argument("--tf32", action="store_true", help="TensorFloat-32 matmuls and convolutions")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    model = build_model("standard_cnn", SHAPE, CLASSES, 0).to(dev)
    results: dict[str, Any] = {
        "device": str(dev),
        "batch": BATCH,
        "tf32": args.tf32,
        "by_clients": {},
    }
    for c in [int(s) for s in args.clients.split(",")]:
        row = measure(model, c, dev, args)
        results["by_clients"][c] = row
        if not args.json:
            print(
                f"C={c}: bmm - vmap gradients {row['bmm_vs_vmap_max_rel_gap']:.1e}, streams - "
                f"vmap {row['streams_vs_vmap_max_rel_gap']:.1e}"
            )
            for k, v in row["median_ms"].items():
                print(f"  {k:11s} {v:8.3f} ms  {row['samples_per_s'][k]:10.0f} samples/s")
            for k, why in row["failed"].items():
                print(f"  {k:11s} failed: {why}")
    if args.json:
        print(json.dumps(results))


def measure(model: torch.nn.Module, c: int, dev: torch.device, args: Any) -> dict[str, Any]:
    """Each form's median milliseconds for ``c`` clients, after checking bmm against vmap."""
    names = [n for n, _ in model.named_parameters()]
    g = torch.Generator().manual_seed(c)
    params = {
        n: (v.detach().unsqueeze(0) + 0.01 * torch.randn(c, *v.shape, generator=g).to(dev))
        for n, v in model.named_parameters()
    }
    x = torch.randn(c, BATCH, *SHAPE, generator=g).to(dev)
    y = torch.randint(0, CLASSES, (c, BATCH), generator=g).to(dev)
    leaves = {n: v.clone().requires_grad_(True) for n, v in params.items()}

    def one_loss(p: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    def form_vmap() -> dict[str, Tensor]:
        return vmap(grad(one_loss))(params, x, y)

    def form_bmm() -> dict[str, Tensor]:
        out = forward_bmm(leaves, x)
        loss = F.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="sum") / BATCH
        return dict(zip(names, torch.autograd.grad(loss, [leaves[n] for n in names])))

    def form_loop() -> dict[str, Tensor]:
        rows = [grad(one_loss)({n: v[i] for n, v in params.items()}, x[i], y[i]) for i in range(c)]
        return {n: torch.stack([r[n] for r in rows]) for n in names}

    lanes = Lanes(dev)

    def form_streams() -> dict[str, Tensor]:
        def one(i: int) -> dict[str, Tensor]:
            return grad(one_loss)({n: v[i] for n, v in params.items()}, x[i], y[i])

        rows = lanes.map(one, c)
        return {n: torch.stack([r[n] for r in rows]) for n in names}

    a, b, s = form_vmap(), form_bmm(), form_streams()
    gap = max(float((a[n] - b[n]).norm() / a[n].norm()) for n in names)
    gap_streams = max(float((a[n] - s[n]).norm() / a[n].norm()) for n in names)
    wanted = args.forms.split(",")
    forms: dict[str, Callable[[], Any]] = {
        "vmap": form_vmap,
        "bmm": form_bmm,
        "loop": form_loop,
        "streams": form_streams,
    }
    failed: dict[str, str] = {}
    if dev.type == "cuda":
        for name, fn in list(forms.items()):
            name += "-graph"
            if name in wanted:
                try:
                    forms[name] = captured(fn, dev)
                except Exception as e:  # noqa: BLE001 - reported, the rest timed
                    failed[name] = str(e).splitlines()[0][:300]
    forms = {k: v for k, v in forms.items() if k in wanted}
    ms: dict[str, list[float]] = {k: [] for k in forms}
    for fn in forms.values():
        fn()
    for _ in range(args.reps):
        for k, fn in forms.items():
            sync(dev)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            sync(dev)
            ms[k].append((time.perf_counter() - t0) / args.iters * 1e3)
    med = {k: statistics.median(v) for k, v in ms.items()}
    return {
        "bmm_vs_vmap_max_rel_gap": gap,
        "streams_vs_vmap_max_rel_gap": gap_streams,
        "median_ms": med,
        "samples_per_s": {k: c * BATCH / (v / 1e3) for k, v in med.items()},
        "failed": failed,
    }


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def captured(fn: Callable[[], Any], dev: torch.device) -> Callable[[], None]:
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


if __name__ == "__main__":
    main()
