"""Workload W: one FedAvg round through fedbug's real engine against a bare PyTorch loop.

W is the FedBug paper's CIFAR setting on random data: the standard CNN (conv64-conv64-384-192-
classes) on 3x32x32 uint8 images (``--shape fmnist``: 1x28x28), 100 clients x 500 samples (IID),
10 clients a round, 5 local epochs of batch 50 (50 steps a client, 25,000 training samples a
round), SGD lr 0.1, weight decay 1e-3, and evaluation of the global model on 10,000 test images
every round.

fedbug runs W through :func:`fedbug.engine.run_experiment` (the sequential executor, the
evaluator and the round loop exactly as ``fedbug run`` uses them; no run folder). Each round's
record gives ``time_train``, ``time_eval`` and ``wall_time``; the script also times the
aggregation (``Aggregate`` methods, the algorithm's ``server_update`` and the finite-weights
check) by wrapping them, so a round splits into training, evaluation, aggregation and the rest.

In the same process, interleaved round by round (from the engine's ``on_round`` callback: fedbug
round r, then bare round r), a bare loop: for the same 10 clients, ``load_state_dict`` of the
global weights into one local model, 5 x 10 steps of forward, cross-entropy, backward and
``torch.optim.SGD`` (same lr and weight decay), NCHW, the batch converted from uint8 as fedbug
does; then the mean of the 10 state dicts. No evaluation, no FL machinery.

Reported per round (median over rounds, the first dropped as a warm-up): seconds of training,
evaluation, aggregation and the rest; samples/s; peak RSS (``resource.getrusage``); and
``ratio_train`` = fedbug training / bare training, ``ratio_round`` = fedbug whole round
(evaluation included) / bare training, ``ratio_round_no_eval`` = fedbug round without its
evaluation / bare round (training + mean).

    python -m benchmarks.speed.speed --quick          # about a minute: 1 local epoch, 4 rounds
    python -m benchmarks.speed.speed                  # full W: 5 epochs, 7 rounds (6 counted)
    python -m benchmarks.speed.speed --profile        # + torch.profiler on one more fedbug round
    python -m benchmarks.speed.speed --device cuda    # W on a GPU, the bare loop on the same GPU
    python -m benchmarks.speed.speed --device cuda --precision tf32 --nondeterministic # fastest GPU
    python -m benchmarks.speed.speed --json --out w.json
    python -m benchmarks.speed.speed --quick --executor cohort   # the round's clients together
    python -m benchmarks.speed.speed --device cuda --executor cohort --cuda-graphs   # in graphs
    python -m benchmarks.speed.speed --device cuda --executor cohort --cuda-graphs \
        --cohort-gradient streams   # each client's own gradient, clients on parallel streams
    python -m benchmarks.speed.speed --quick --levers  # each lever's gain, paired (see levers())

``--levers`` times each lever of the speed issue against its "off" setting on W's model and
data, the two alternating within one process (order swapped every repetition), and reports the
median over repetitions of t(off) / t(on): channels_last for training (one client, 10 steps)
and for evaluation (2,000 images), the evaluation batch (500 against 100), two threads against
one (4 clients, sequential executor), and ``executor: processes`` with 2 single-thread workers
against the sequential executor with 2 threads (4 clients a round).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import resource
import statistics
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

import fedbug.engine.experiment as experiment
import fedbug.engine.rounds as engine
from benchmarks.common import command, machine_info, rss_mb
from fedbug.config import load_config
from fedbug.core.device import resolve_device
from fedbug.data import FederatedDataset
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import train_client
from fedbug.models import build_model

SHAPES = {"cifar": (3, 32, 32), "fmnist": (1, 28, 28)}
MEANS = {"cifar": (0.4914, 0.4822, 0.4465), "fmnist": (0.2860,)}
STDS = {"cifar": (0.2470, 0.2435, 0.2616), "fmnist": (0.3530,)}
NUM_CLIENTS = 100
PER_ROUND = 10
SAMPLES = 500
TEST = 10_000
BATCH = 50
LR = 0.1
WEIGHT_DECAY = 1e-3
MEMORY = ("contiguous", "channels_last")
TARGETS = {"ratio_train": 0.90, "ratio_round": 1.0, "peak_rss_mb": 1024.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Workload W: fedbug vs a bare PyTorch loop.")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="cifar")
    ap.add_argument("--classes", type=int, default=10, help="number of classes (10)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds incl. 1 warm-up (7)")
    ap.add_argument("--epochs", type=int, default=None, help="local epochs (5)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    ap.add_argument("--eval-batch", type=int, default=None, help="eval batch (fedbug's default)")
    ap.add_argument("--quick", action="store_true", help="1 local epoch, 4 rounds: about a minute")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after the timed rounds, one more fedbug round under torch.profiler (untimed)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--device",
        default="cpu",
        help="fedbug's device key (cpu, cuda, cuda:N, auto); the bare loop runs on the same",
    )
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    ap.add_argument(
        "--nondeterministic", action="store_true",
        help="deterministic: false (on a GPU, cuDNN autotunes; the bare loop then too)",
    )  # fmt: skip
    ap.add_argument(
        "--executor", default="sequential", choices=["sequential", "cohort"],
        help="fedbug's executor (cohort: the round's clients as one vectorised step)",
    )  # fmt: skip
    ap.add_argument(
        "--cohort-clients", type=int, default=None,
        help="executor cohort: clients trained together at most (default: the round)",
    )  # fmt: skip
    ap.add_argument(
        "--cuda-graphs", action="store_true",
        help="executor cohort: the vectorised gradient replayed from CUDA graphs (a GPU only)",
    )  # fmt: skip
    ap.add_argument(
        "--cohort-gradient", choices=["vmap", "streams"], default="vmap",
        help="executor cohort: cohort.gradient (streams: each client's own kernels, clients on "
        "parallel CUDA streams)",
    )  # fmt: skip
    ap.add_argument(
        "--bare-memory-format", choices=["contiguous", "channels_last"], default="contiguous",
        help="the bare loop's layout (channels_last: weights and batches NHWC, by hand)",
    )  # fmt: skip
    ap.add_argument("--levers", action="store_true", help="paired gain of each lever instead")
    ap.add_argument("--reps", type=int, default=None, help="--levers repetitions (5; quick 3)")
    ap.add_argument(
        "--memory-format", choices=["contiguous", "channels_last"], default=None,
        help="fedbug's memory_format (default: the config's)",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--out", default=None, help="also write the JSON to this file")
    return ap.parse_args(argv)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def load1() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def make_dataset(shape: str, classes: int, seed: int) -> FederatedDataset:
    g = torch.Generator().manual_seed(seed)
    c, h, w = SHAPES[shape]
    n = NUM_CLIENTS * SAMPLES
    x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    xt = torch.randint(0, 256, (TEST, c, h, w), dtype=torch.uint8, generator=g)
    yt = torch.randint(0, classes, (TEST,), generator=g)
    return FederatedDataset(
        f"random-{shape}", x, y, xt, yt, classes, mean=MEANS[shape], std=STDS[shape]
    )


class Timer:
    """Accumulated seconds of the wrapped aggregation calls in the current round."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t

        return timed


def instrument(timer: Timer) -> None:
    """Time aggregation inside the engine without changing it: the ``Aggregate`` methods, the
    algorithm's ``server_update`` and ``check_weights`` (module globals the round loop looks up).
    Rounds aggregate each update as it arrives, so ``Aggregate.add`` runs inside the round's
    ``time_train`` too: its seconds are counted in both (with each update's check, also inside
    ``time_train``: small beside the sequential executor's round, not beside the cohort
    executor's on a GPU, 15-23 ms of the H200's 0.18-0.24 s in session 22)."""

    class TimedAggregate(Aggregate):
        pass

    for name in ("__init__", "add", "mean_delta", "delta_sum", "units_trained_by", "client_drift"):
        setattr(TimedAggregate, name, timer.wrap(getattr(Aggregate, name)))
    engine.Aggregate = TimedAggregate
    engine.check_weights = timer.wrap(engine.check_weights)
    build = experiment.build_algorithm

    def build_timed(*args: Any, **kwargs: Any) -> Any:
        alg = build(*args, **kwargs)
        alg.server_update = timer.wrap(alg.server_update)
        return alg

    experiment.build_algorithm = build_timed


class BareLoop:
    """The plain PyTorch round: state_dict load, 50 SGD steps a client, mean of state dicts."""

    def __init__(
        self,
        ds: FederatedDataset,
        epochs: int,
        seed: int,
        device: str = "cpu",
        memory_format: str = "contiguous",
    ) -> None:
        self.ds = ds
        self.epochs = epochs
        self.device = torch.device(device)
        model = build_model("standard_cnn", ds.input_shape, ds.num_classes, seed)
        self.model = model.to(self.device)
        #: channels_last: the model's weights and each batch NHWC, as a hand-written loop would
        self.channels_last = memory_format == "channels_last"
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.global_sd = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.mean = torch.tensor(ds.mean).view(1, -1, 1, 1).to(self.device)
        self.std = torch.tensor(ds.std).view(1, -1, 1, 1).to(self.device)

    def round(self, clients: list[int]) -> tuple[float, float]:
        """Seconds of training and of the mean of the weights."""
        model, ds = self.model, self.ds
        t0 = time.perf_counter()
        states = []
        for c in clients:
            model.load_state_dict(self.global_sd)
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
            xs = ds.train_x[c * SAMPLES : (c + 1) * SAMPLES].to(self.device)  # once a client
            ys = ds.train_y[c * SAMPLES : (c + 1) * SAMPLES].to(self.device)
            for _ in range(self.epochs):
                perm = torch.randperm(SAMPLES, generator=self.gen).to(self.device)
                for b in range(0, SAMPLES, BATCH):
                    idx = perm[b : b + BATCH]
                    x = (xs[idx].float() / 255.0 - self.mean) / self.std
                    if self.channels_last:
                        x = x.contiguous(memory_format=torch.channels_last)
                    loss = F.cross_entropy(model(x), ys[idx])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the GPU's work done before the clock is read
        t1 = time.perf_counter()
        self.global_sd = {k: torch.stack([s[k] for s in states]).mean(0) for k in self.global_sd}
        return t1 - t0, time.perf_counter() - t1


def med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def run(args: argparse.Namespace) -> dict[str, Any]:
    epochs = args.epochs or (1 if args.quick else 5)
    rounds = args.rounds or (4 if args.quick else 7)
    if rounds < 2:
        raise SystemExit("--rounds must be at least 2 (the first is dropped)")
    if args.threads:
        torch.set_num_threads(args.threads)
    rss_start = rss_mb()
    ds = make_dataset(args.shape, args.classes, args.seed)
    rss_data = rss_mb()
    doc: dict[str, Any] = {
        "name": "workload-w",
        "seed": args.seed,
        # the name only: the data is passed in
        "dataset": "cifar10" if args.shape == "cifar" else "fashion_mnist",
        "model": "standard_cnn",
        "num_clients": NUM_CLIENTS,
        "partition": "iid",
        "clients_per_round": PER_ROUND,
        "rounds": rounds + (1 if args.profile else 0),
        "local_epochs": epochs,
        "batch_size": BATCH,
        "lr": LR,
        "weight_decay": WEIGHT_DECAY,
        "algorithm": "fedavg",
        "policy": "none",
        "eval_every": 1,
        "threads": args.threads or torch.get_num_threads(),
        "device": args.device,
        "precision": args.precision,
        "deterministic": not args.nondeterministic,
        "executor": args.executor,
    }
    if args.executor == "cohort":
        doc["cohort"] = {
            "max_clients": args.cohort_clients,
            "cuda_graphs": args.cuda_graphs,
            "gradient": args.cohort_gradient,
        }
    if args.eval_batch:
        doc["eval_batch_size"] = args.eval_batch
    if args.memory_format:
        doc["memory_format"] = args.memory_format
    cfg = load_config(None, doc=doc)
    timer = Timer()
    instrument(timer)
    bare = BareLoop(
        ds, epochs, args.seed, str(resolve_device(args.device)), args.bare_memory_format
    )
    samples = PER_ROUND * SAMPLES * epochs
    rows: list[dict[str, float]] = []
    prof_box: dict[str, Any] = {}

    def on_round(rec: dict[str, Any]) -> None:
        if rec["round"] > rounds:  # the profiled round: stop and keep the profiler
            prof_box["prof"].__exit__(None, None, None)
            return
        agg = timer.seconds
        timer.seconds = 0.0
        b_train, b_agg = bare.round(sorted(rec["clients"]))
        wall = rec["wall_time"]
        rows.append(
            {
                "round": rec["round"],
                "fb_train": rec["time_train"],
                "fb_eval": rec["time_eval"],
                "fb_agg": agg,
                "fb_rest": wall - rec["time_train"] - rec["time_eval"] - agg,
                "fb_wall": wall,
                "bare_train": b_train,
                "bare_agg": b_agg,
                "load1": load1(),
                "rss_mb": rss_mb(),
            }
        )
        if not args.json:
            r = rows[-1]
            print(
                f"  round {r['round']}: fedbug train {r['fb_train']:.2f} s eval "
                f"{r['fb_eval']:.2f} s wall {r['fb_wall']:.2f} s | bare train "
                f"{r['bare_train']:.2f} s | load {r['load1']:.2f} rss {r['rss_mb']:.0f} MB",
                file=sys.stderr,
                flush=True,
            )
        if rec["round"] == rounds:  # peak of the timed rounds, before any profiling
            prof_box["peak"] = peak_rss_mb()
        if args.profile and rec["round"] == rounds:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if resolve_device(args.device).type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)  # the kernels' own time too
            prof = torch.profiler.profile(activities=acts)
            prof.__enter__()
            prof_box["prof"] = prof
        timer.seconds = 0.0

    t_all = time.perf_counter()
    engine.run_experiment(cfg, dataset=ds, on_round=on_round)
    seconds = time.perf_counter() - t_all
    counted = rows[1:]
    fb = {k: med(counted, "fb_" + k) for k in ("train", "eval", "agg", "rest", "wall")}
    bt, ba = med(counted, "bare_train"), med(counted, "bare_agg")
    ratio_train = statistics.median(r["fb_train"] / r["bare_train"] for r in counted)
    ratio_round = statistics.median(r["fb_wall"] / r["bare_train"] for r in counted)
    ratio_no_eval = statistics.median(
        (r["fb_wall"] - r["fb_eval"]) / (r["bare_train"] + r["bare_agg"]) for r in counted
    )
    out: dict[str, Any] = {
        "workload": "W",
        "executor": args.executor,
        "bare_memory_format": args.bare_memory_format,
        "shape": list(SHAPES[args.shape]),
        "classes": args.classes,
        "quick": bool(args.quick),
        "epochs": epochs,
        "rounds": rounds,
        "counted_rounds": len(counted),
        "samples_per_round": samples,
        "eval_samples": TEST,
        "eval_batch_size": cfg.eval_batch_size,
        "fedbug": {**fb, "samples_per_s_train": samples / fb["train"]},
        "bare": {"train": bt, "agg": ba, "samples_per_s_train": samples / bt},
        "fedbug_samples_per_s_round": samples / fb["wall"],
        "ratio_train": ratio_train,
        "ratio_train_of_medians": fb["train"] / bt,
        "ratio_round": ratio_round,
        "ratio_round_no_eval": ratio_no_eval,
        "peak_rss_mb": prof_box.get("peak", peak_rss_mb()),
        "peak_rss_mb_incl_profile": peak_rss_mb(),
        "rss_mb": {"start": rss_start, "after_data": rss_data, "end": rss_mb()},
        "targets": TARGETS,
        "load1": [r["load1"] for r in rows],
        "seconds": seconds,
        "rows": rows,
        "machine": machine_info(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command(),
    }
    out["met"] = {
        "ratio_train": ratio_train <= TARGETS["ratio_train"],
        "ratio_round": ratio_round <= TARGETS["ratio_round"],
        "peak_rss_mb": out["peak_rss_mb"] <= TARGETS["peak_rss_mb"],
    }
    if "prof" in prof_box:
        ka = prof_box["prof"].key_averages()
        out["profile"] = ka.table(sort_by="self_cpu_time_total", row_limit=20)
        if resolve_device(args.device).type == "cuda":
            try:
                out["profile_device"] = ka.table(sort_by="self_device_time_total", row_limit=25)
            except (KeyError, AttributeError):  # torch before 2.4 called it cuda time
                out["profile_device"] = ka.table(sort_by="self_cuda_time_total", row_limit=25)
    return out


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def levers(args: argparse.Namespace) -> dict[str, Any]:
    """Paired t(off) / t(on) of each lever, alternating within this process."""
    from fedbug.engine import Experiment
    from fedbug.engine.client import ClientTask
    from fedbug.engine.evaluate import Evaluator
    from fedbug.engine.executors import SequentialExecutor
    from fedbug.engine.executors.processes import ProcessExecutor, WorkerSpec

    reps = args.reps or (3 if args.quick else 5)
    ds = make_dataset(args.shape, args.classes, args.seed)
    doc: dict[str, Any] = {
        "name": "workload-w-levers", "seed": args.seed, "dataset": "cifar10",
        "model": "standard_cnn", "num_clients": NUM_CLIENTS, "partition": "iid",
        "clients_per_round": PER_ROUND, "local_steps": 10, "batch_size": BATCH, "lr": LR,
        "weight_decay": WEIGHT_DECAY, "count_flops": False, "threads": 1,
    }  # fmt: skip
    cfg = load_config(None, doc=doc)
    exp = {m: Experiment(cfg.model_copy(update={"memory_format": m}), ds) for m in MEMORY}
    w = exp["contiguous"].initial_weights()
    rts = {m: e.make_runtime() for m, e in exp.items()}
    task = ClientTask(1, 0, args.seed, LR, SAMPLES)
    tasks = [ClientTask(1, i, args.seed, LR, SAMPLES) for i in range(4)]
    states = {t.client: {} for t in tasks}
    test = dataclasses.replace(ds, test_x=ds.test_x[:2000], test_y=ds.test_y[:2000])
    evs = {
        (m, b): Evaluator(e.template, e.space, test, b, m)
        for m, e in exp.items()
        for b in (100, 500)
    }
    seq = SequentialExecutor(rts["contiguous"], exp["contiguous"].client_data)

    def train(m: str) -> Any:
        return lambda: train_client(w, task, exp[m].client_data(0), {}, rts[m])

    def threads(n: int) -> Any:
        def go() -> None:
            torch.set_num_threads(n)
            seq.run_round(w, tasks, states)

        return go

    procs = ProcessExecutor(WorkerSpec(cfg, ds), workers=2, threads=1)
    pairs = {
        "channels_last_train (1 client, 10 steps)": (train("contiguous"), train("channels_last")),
        "channels_last_eval (2,000 images, batch 500)": (
            lambda: evs["contiguous", 500].evaluate(w),
            lambda: evs["channels_last", 500].evaluate(w),
        ),
        "eval_batch 500 -> 100 (contiguous)": (
            lambda: evs["contiguous", 500].evaluate(w),
            lambda: evs["contiguous", 100].evaluate(w),
        ),
        "eval contiguous/500 -> channels_last/100": (
            lambda: evs["contiguous", 500].evaluate(w),
            lambda: evs["channels_last", 100].evaluate(w),
        ),
        "threads 1 -> 2 (4 clients, sequential)": (threads(1), threads(2)),
        "sequential 2 threads -> processes 2x1 (4 clients)": (
            threads(2),
            lambda: procs.run_round(w, tasks, states),
        ),
    }
    out: dict[str, Any] = {}
    try:
        for name, (off, on) in pairs.items():
            off(), on()  # warm-up
            ratios, t_off, t_on = [], [], []
            for k in range(reps):
                if k % 2:
                    b, a = _timed(on), _timed(off)
                else:
                    a, b = _timed(off), _timed(on)
                ratios.append(a / b)
                t_off.append(a)
                t_on.append(b)
            out[name] = {
                "gain_paired_median": statistics.median(ratios),
                "ratios": ratios,
                "off_s_median": statistics.median(t_off),
                "on_s_median": statistics.median(t_on),
                "load1": load1(),
            }
            print(
                f"  {name}: {statistics.median(ratios):.3f}x (off {out[name]['off_s_median']:.2f}"
                f" s, on {out[name]['on_s_median']:.2f} s, load {load1():.1f})",
                file=sys.stderr,
                flush=True,
            )
    finally:
        procs.close()
    return {
        "levers": out,
        "reps": reps,
        "machine": machine_info(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command(),
    }


def print_table(res: dict[str, Any]) -> None:
    m = res["machine"]
    print(f"command: {res['command']}")
    print(
        f"machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']}, {m['threads']} threads "
        f"({m['interop_threads']} inter-op); Python {m['python']}; {res['date']}"
    )
    loads = ", ".join(f"{x:.2f}" for x in res["load1"])
    print(f"1-minute load after each round: {loads}")
    c, h, w = res["shape"]
    print(
        f"W: standard_cnn on {c}x{h}x{w} random uint8, {res['classes']} classes; FedAvg, 100 "
        f"clients x 500, 10 a round, {res['epochs']} local epochs x 10 batches of 50 "
        f"({res['samples_per_round']} samples a round); eval on {res['eval_samples']} images "
        f"(batch {res['eval_batch_size']}) every round"
    )
    if res["quick"]:
        print(
            f"QUICK MODE: {res['epochs']} local epoch(s), {res['rounds']} rounds: not workload W "
            "as specified; ratios indicative only"
        )
    print(f"median of {res['counted_rounds']} rounds (the first of {res['rounds']} dropped)\n")
    fb, bare = res["fedbug"], res["bare"]
    print(
        "| per round | training s | evaluation s | aggregation s | rest s | total s | samples/s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| fedbug | {fb['train']:.2f} | {fb['eval']:.2f} | {fb['agg']:.3f} | {fb['rest']:.3f} "
        f"| {fb['wall']:.2f} | {fb['samples_per_s_train']:.0f} train, "
        f"{res['fedbug_samples_per_s_round']:.0f} round |"
    )
    print(
        f"| bare | {bare['train']:.2f} | - | {bare['agg']:.3f} | - | "
        f"{bare['train'] + bare['agg']:.2f} | {bare['samples_per_s_train']:.0f} train |"
    )
    t = res["targets"]
    print()
    print("| measure | value | target | met |")
    print("| --- | --- | --- | --- |")
    for key, fmt in (("ratio_train", "{:.3f}x"), ("ratio_round", "{:.3f}x")):
        met = "yes" if res["met"][key] else "no"
        print(f"| {key} | {fmt.format(res[key])} | <= {t[key]:.2f}x | {met} |")
    print(f"| ratio_round_no_eval | {res['ratio_round_no_eval']:.3f}x | - | - |")
    met = "yes" if res["met"]["peak_rss_mb"] else "no"
    print(f"| peak_rss_mb | {res['peak_rss_mb']:.0f} | <= {t['peak_rss_mb']:.0f} | {met} |")
    rss = res["rss_mb"]
    print(
        f"\nRSS: {rss['start']:.0f} MB after imports, {rss['after_data']:.0f} MB with the data "
        f"tensors, {rss['end']:.0f} MB at the end; {res['seconds']:.0f} s in all"
    )
    if "profile" in res:
        print("\ntorch.profiler, one fedbug round (training + evaluation + aggregation):")
        print(res["profile"])
    if "profile_device" in res:
        print("\nthe same round by the GPU kernels' own time:")
        print(res["profile_device"])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.levers:
        res = levers(args)
        text = json.dumps(res, indent=2)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        print(f"command: {res['command']}\n| lever | gain t(off)/t(on), paired median |")
        print("| --- | --- |")
        for name, row in res["levers"].items():
            print(f"| {name} | {row['gain_paired_median']:.3f}x |")
        return
    res = run(args)
    text = json.dumps(res, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        print(text)
    else:
        print_table(res)


if __name__ == "__main__":
    main()
