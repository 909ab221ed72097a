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
shape (one chunk of that many clients; FedDyn keeps a state a client); ``--augment`` augments the
clients' batches, a group's at once (part of the step's rest).

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


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2, help="samples a client a step (2)")
    ap.add_argument("--steps", type=int, default=20, help="local steps a round (20)")
    ap.add_argument("--clients", type=int, default=10, help="clients a round, one chunk (10)")
    ap.add_argument("--algorithm", default="fedavg", help="the algorithm (fedavg)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument(
        "--cuda-graphs", action="store_true", help="cohort.cuda_graphs: the gradient in graphs"
    )
    ap.add_argument(
        "--gradient", choices=["vmap", "streams"], default="vmap", help="cohort.gradient (vmap)"
    )
    ap.add_argument(
        "--augment",
        choices=["none", "flip", "crop_flip"],
        default="none",
        help="augment (none): the group's batches augmented, part of the step's rest",
    )
    return ap.parse_args(argv)


def config(args: argparse.Namespace) -> dict[str, Any]:
    cuda = args.device.startswith("cuda")
    return dict(name="cohort-step", dataset="cifar10", model="standard_cnn",
                num_clients=max(100, args.clients), partition="iid",
                clients_per_round=args.clients, rounds=2, algorithm=args.algorithm,
                local_steps=args.steps, batch_size=args.batch, lr=0.05, weight_decay=1e-3,
                eval_every=1000, count_flops=False, threads=1, executor="cohort",
                device=args.device, deterministic=not cuda, augment=args.augment,
                cohort={"cuda_graphs": args.cuda_graphs, "gradient": args.gradient})  # fmt: skip


EXECUTOR_METHODS = ("group_step", "gradients", "gradient_fn", "train_chunk", "open_chunk")


def timed_rounds(doc: dict[str, Any], data: Any, sync: Callable[[], None]) -> dict[str, Any]:
    """Seconds of each call in the second round (the first warms up): its group steps and
    their gradients, its chunk, the chunk's opening and its clients' results."""
    Ex, result = cohort.CohortExecutor, client.LocalRound.result
    saved = {n: getattr(Ex, n) for n in EXECUTOR_METHODS}
    t: dict[str, list[float]] = {k: [] for k in ("group", "grad", "chunk", "open", "result")}
    timed(Ex, "group_step", t["group"], sync)
    timed(Ex, "gradients", t["grad"], sync)
    timed(Ex, "train_chunk", t["chunk"], sync)
    timed(Ex, "open_chunk", t["open"], sync)
    timed(client.LocalRound, "result", t["result"], sync)
    opened = Ex.open_chunk
    firsts = []  # the group steps taken before each chunk opened

    def open_chunk(*a: Any, **k: Any) -> Any:
        firsts.append((len(t["group"]), len(t["grad"]), len(t["result"])))
        return opened(*a, **k)

    Ex.open_chunk = open_chunk
    try:
        engine.run_experiment(load_config(None, doc=doc), dataset=data)
    finally:
        client.LocalRound.result = result
        for n, fn in saved.items():
            setattr(Ex, n, fn)
    g, d, r = firsts[-1]
    return {"group": t["group"][g:], "grad": t["grad"][d:], "chunk": t["chunk"][-1],
            "open": t["open"][-1], "result": sum(t["result"][r:])}  # fmt: skip


def counted_round(doc: dict[str, Any], data: Any, steps: int) -> tuple[dict[str, float], int]:
    """The operations dispatched outside the captured gradient in one round, eagerly: a group
    step's (by name, a step) and the round's in all."""
    Ex = cohort.CohortExecutor
    saved = {n: getattr(Ex, n) for n in EXECUTOR_METHODS}
    whole, inner, chunk_ops = CountOps(), CountOps(), CountOps()
    counted(Ex, "group_step", whole)
    counted_fn(Ex, inner)
    counted(Ex, "train_chunk", chunk_ops)
    try:
        doc = {**doc, "rounds": 1, "cohort": {}}
        engine.run_experiment(load_config(None, doc=doc), dataset=data)
    finally:
        for n, fn in saved.items():
            setattr(Ex, n, fn)
    outside = {k: (v - inner.ops[k]) / steps for k, v in whole.ops.items() if v > inner.ops[k]}
    return outside, sum(chunk_ops.ops.values()) - sum(inner.ops.values())


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    torch.set_num_threads(1)
    data = make_dataset("cifar", 10, 0)
    doc = config(args)
    t = timed_rounds(doc, data, sync)
    g, d = statistics.median(t["group"]), statistics.median(t["grad"])
    steps = sum(t["group"])
    between = t["chunk"] - steps - t["open"] - t["result"]
    outside, round_ops = counted_round(doc, data, args.steps)
    print(f"W's model, {args.clients} clients x batch {args.batch}, {args.algorithm}, "
          f"augment {args.augment}, {args.device}, 1 thread; ms a group step: {1e3 * g:.1f}, "
          f"of which the gradient {1e3 * d:.1f}, the rest of the step {1e3 * (g - d):.1f}; "
          f"outside its {len(t['group'])} group steps a round's chunk took "
          f"{1e3 * (t['chunk'] - steps):.0f} ms: opening {1e3 * t['open']:.0f}, "
          f"the clients' results {1e3 * t['result']:.0f}, "
          f"the rest (the clients' Python between steps, drawing batches) "
          f"{1e3 * between:.0f}")  # fmt: skip
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
