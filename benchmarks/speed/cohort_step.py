"""Where a cohort group step's time goes: the vectorised gradient against the rest of the step.

Workload W's model (the standard CNN on 3x32x32, W's random data) under ``executor: cohort``,
10 clients a round stepping together, FedAvg with SGD and weight decay, ``--batch`` samples a
client (small batches leave the step's own work visible beside the gradient), one thread, on
the CPU or a GPU (``--device cuda``: autotuned kernels, the device synchronised around each
timed call). The executor's ``group_step`` and ``gradients`` are timed around each call in the
second of two rounds (the first warms up); reported in milliseconds a group step: the group
step, its gradient (``vmap(grad)`` over the clients) and the difference (the algorithm's terms,
clipping, the optimiser's step, the stacked vectors' reads and writes), the chunk's time outside
its group steps (its opening, each client's closing into a result, and the rest: the clients'
Python between steps, drawing batches), and the tensor operations dispatched outside the
gradient (on a GPU, each a kernel launch or at least a trip through the dispatcher on the
host): a group step's, and a round's in all (opening and closing the chunk, drawing the
batches), over ``--steps`` local steps. ``--clients`` and ``--algorithm`` change the round's
shape (one chunk of that many clients; FedDyn keeps a state a client).

    python -m benchmarks.speed.cohort_step --batch 2     # about 20 s
    python -m benchmarks.speed.cohort_step --batch 50 --device cuda
    python -m benchmarks.speed.cohort_step --batch 50 --device cuda --cuda-graphs
    python -m benchmarks.speed.cohort_step --clients 200 --batch 6 --steps 5 --algorithm feddyn
                                            # scale-10k's shape: many clients, a few small steps
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.speed.speed import make_dataset
from fedbug import engine
from fedbug.config import load_config
from fedbug.engine import client
from fedbug.engine.executors import cohort


class CountOps(TorchDispatchMode):
    """The aten operations dispatched inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def timed(cls: type, name: str, into: list[float], sync: Callable[[], None]) -> None:
    """Wrap ``cls.name`` to append each call's seconds to ``into`` (``sync`` waits for the
    device before the clock is read: on a GPU the call's kernels, not their launches)."""
    fn = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sync()
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sync()
            into.append(time.perf_counter() - t)

    setattr(cls, name, wrapper)


def counted(cls: type, name: str, mode: CountOps) -> None:
    fn = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with mode:
            return fn(*args, **kwargs)

    setattr(cls, name, wrapper)


def counted_fn(cls: type, mode: CountOps) -> None:
    """Count inside the functions ``cls.gradient_fn`` makes: what ``cuda_graphs`` captures."""
    make = cls.gradient_fn

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        fn = make(*args, **kwargs)

        def inside(*a: Any) -> Any:
            with mode:
                return fn(*a)

        return inside

    cls.gradient_fn = wrapper


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2, help="samples a client a step (2)")
    ap.add_argument("--steps", type=int, default=20, help="group steps timed in all (20)")
    ap.add_argument("--clients", type=int, default=10, help="clients a round, one chunk (10)")
    ap.add_argument("--algorithm", default="fedavg", help="the algorithm (fedavg)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument(
        "--cuda-graphs", action="store_true", help="cohort.cuda_graphs: the gradient in graphs"
    )
    ap.add_argument(
        "--gradient", choices=["vmap", "streams"], default="vmap", help="cohort.gradient (vmap)"
    )
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.set_num_threads(1)
    data = make_dataset("cifar", 10, 0)
    doc = dict(name="cohort-step", dataset="cifar10", model="standard_cnn",
               num_clients=max(100, args.clients), partition="iid",
               clients_per_round=args.clients, rounds=2, algorithm=args.algorithm,
               local_steps=args.steps, batch_size=args.batch, lr=0.05, weight_decay=1e-3,
               eval_every=1000, count_flops=False, threads=1, executor="cohort", device=args.device,
               deterministic=not cuda,
               cohort={"cuda_graphs": args.cuda_graphs, "gradient": args.gradient})  # fmt: skip
    Ex = cohort.CohortExecutor
    saved = {n: getattr(Ex, n) for n in ("group_step", "gradients", "gradient_fn", "train_chunk")}
    group: list[float] = []
    grad: list[float] = []
    chunk: list[float] = []
    opening: list[float] = []
    closing: list[float] = []
    saved["open_chunk"] = Ex.open_chunk
    result = client.LocalRound.result
    timed(Ex, "group_step", group, sync)
    timed(Ex, "gradients", grad, sync)
    timed(Ex, "train_chunk", chunk, sync)
    timed(Ex, "open_chunk", opening, sync)
    timed(client.LocalRound, "result", closing, sync)
    try:
        engine.run_experiment(load_config(None, doc=doc), dataset=data)
    finally:
        client.LocalRound.result = result
        for n, fn in saved.items():
            setattr(Ex, n, fn)
    closed = sum(closing[-args.clients :])  # the second round's clients'
    between = chunk[-1] - sum(group[-args.steps :]) - opening[-1] - closed
    last = group[-args.steps :]  # the second round's (the first warms up)
    g, d = statistics.median(last), statistics.median(grad[-args.steps :])
    whole, inner, chunk_ops = CountOps(), CountOps(), CountOps()
    counted(Ex, "group_step", whole)
    counted_fn(Ex, inner)
    counted(Ex, "train_chunk", chunk_ops)
    engine.run_experiment(load_config(None, doc={**doc, "rounds": 1, "cohort": {}}), dataset=data)
    for n, fn in saved.items():
        setattr(Ex, n, fn)
    outside = {k: (v - inner.ops[k]) / args.steps for k, v in whole.ops.items() if v > inner.ops[k]}
    round_ops = sum(chunk_ops.ops.values()) - sum(inner.ops.values())
    print(f"W's model, {args.clients} clients x batch {args.batch}, {args.algorithm}, "
          f"{args.device}, 1 thread; ms a group step: {1e3 * g:.1f}, of which the gradient "
          f"{1e3 * d:.1f}, the rest of the step {1e3 * (g - d):.1f}; outside its {len(last)} "
          f"group steps a round's chunk took {1e3 * (chunk[-1] - sum(last)):.0f} ms: opening "
          f"{1e3 * opening[-1]:.0f}, the clients' results {1e3 * closed:.0f}, the rest (the "
          f"clients' Python between steps, drawing batches) {1e3 * between:.0f}")  # fmt: skip
    print(
        f"operations a group step outside the captured gradient: {sum(outside.values()):.0f} "
        f"({', '.join(f'{k} {v:g}' for k, v in sorted(outside.items(), key=lambda kv: -kv[1]))})"
    )
    print(
        f"operations a round of {args.steps} local steps outside the captured gradient: "
        f"{round_ops} ({round_ops / args.steps:.0f} a step)"
    )


if __name__ == "__main__":
    main()
