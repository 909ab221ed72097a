"""The CUDA path on a GPU: these run only where torch sees a CUDA device, and the suite hides a
GPU unless asked (``conftest.py``). CI has none and skips them; on a GPU machine run
``FEDBUG_TEST_GPU=1 python -m pytest tests/test_cuda.py tests/test_golden.py`` (the golden test
then also trains every family on the GPU against the CPU's record).

What they hold: the same config and seed give the same numbers twice on a GPU
(``deterministic: true``, the default); ``precision: fp32`` is IEEE float32 (TensorFloat-32 off)
and follows the CPU to float32 rounding, ``tf32`` is used only when asked; the data set kept on
the GPU gives the numbers of one moved per client; bf16 and fp16 train near fp32; a killed run
resumes on the GPU to the uninterrupted numbers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from executor_checks import after_first_round, cohort_steps_after_first_round, local_round
from tiny import method_needs, without_timing

import fedbug
from fedbug.config import config_hash, load_config
from fedbug.data import FederatedDataset
from fedbug.engine import run_experiment, weights_sha256
from fedbug.engine.experiment import ClientSide

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device, and FEDBUG_TEST_GPU=1 on a machine with one",
)


def random_images(n_train: int = 2000, n_test: int = 500, seed: int = 0) -> FederatedDataset:
    """CIFAR-shaped uint8 images with random labels: the paper's CNN's kernels, no download."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n_train, 3, 32, 32), dtype=torch.uint8, generator=g)
    xt = torch.randint(0, 256, (n_test, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n_train,), generator=g)
    yt = torch.randint(0, 10, (n_test,), generator=g)
    mean, std = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
    return FederatedDataset("random-cifar", x, y, xt, yt, 10, mean=mean, std=std)


def cnn(**overrides: Any) -> Any:
    """FedBug's CIFAR setting, small: the standard CNN, 10 clients, 3 a round, 2 rounds of 20
    steps of 50, clipping at 10, bottom-up unfreezing over 40% of the steps."""
    doc = {
        "name": "cuda",
        "model": "standard_cnn",
        "num_clients": 10,
        "clients_per_round": 3,
        "rounds": 2,
        "local_steps": 20,
        "batch_size": 50,
        "clip_grad_norm": 10.0,
        "policy": "bottom_up",
        "count_flops": False,
        "device": "cuda",
        **overrides,
    }
    return load_config(None, doc=doc)


def moved_apart(a: torch.Tensor, b: torch.Tensor, w0: torch.Tensor) -> float:
    """How far two runs' final weights are apart, relative to how far training moved them."""
    return float((a.double() - b.double()).norm() / (a.double() - w0.double()).norm())


@pytest.mark.parametrize("algorithm", ["fedavg", "feddyn", "scaffold", "fedexp"])
def test_the_same_config_and_seed_give_the_same_numbers_twice(algorithm):
    ds = random_images()
    first = fedbug.run(cnn(algorithm=algorithm), dataset=ds)
    second = fedbug.run(cnn(algorithm=algorithm), dataset=ds)
    assert first.summary["environment"]["device"].startswith("cuda:0")
    kernels = first.summary["environment"]["gpu_kernels"]
    assert (kernels["deterministic"], kernels["tf32"]) == (True, False)
    assert weights_sha256(first.weights) == weights_sha256(second.weights)
    assert without_timing(first.records) == without_timing(second.records)


@pytest.mark.parametrize(
    ("model", "options"),
    [("standard_cnn", {}), ("resnet18", {"units": "block"})],
)
def test_fp32_on_the_gpu_follows_the_cpu_and_tf32_only_when_asked(model, options):
    """One local step of one client, every unit training: the GPU's fp32 step equals the CPU's
    to float32 rounding, TensorFloat-32's (a 10-bit mantissa) is further off. The bound is that
    of two CPU layouts of one step (NHWC against NCHW: 1.4e-6 of the step for the CNN, 2.2e-4
    for ResNet-18, whose batch norms amplify rounding); an H200 gave fp32 1.4e-6 / 7.7e-5,
    tf32 1.3e-2 / 4.6e-3. One step, since training on random labels at lr 0.1 with clipping
    amplifies any rounding: after 2 rounds of 10 steps the two CPU layouts are 7e-4 apart and
    the H200 0.15 from the CPU."""
    ds = random_images()
    kw = {"model": model, "model_options": options, "rounds": 1, "clients_per_round": 1}
    kw |= {"local_steps": 1, "policy": "none", "clip_grad_norm": None}
    cpu = fedbug.run(cnn(device="cpu", **kw), dataset=ds)
    gpu = fedbug.run(cnn(**kw), dataset=ds)
    tf32 = fedbug.run(cnn(precision="tf32", **kw), dataset=ds)
    w0 = ClientSide(cnn(device="cpu", **kw), dataset=ds).initial_weights()
    fp32_gap = moved_apart(gpu.weights, cpu.weights, w0)
    tf32_gap = moved_apart(tf32.weights, cpu.weights, w0)
    print(f"{model}: one step, GPU - CPU over the step, fp32 {fp32_gap:.1e}, tf32 {tf32_gap:.1e}")
    assert fp32_gap < 1e-3
    assert tf32_gap > 10 * fp32_gap  # TensorFloat-32 was off in fp32
    assert tf32.summary["environment"]["gpu_kernels"]["tf32"] is True
    assert config_hash(cnn(precision="tf32")) != config_hash(cnn())


def test_the_data_set_kept_on_the_gpu_gives_the_numbers_of_one_moved_per_client():
    ds = random_images()
    kept = fedbug.run(cnn(), dataset=ds)
    moved = fedbug.run(cnn(device_data_share=0.0), dataset=ds)
    assert kept.summary["environment"]["data_on_device"] == "device"
    assert moved.summary["environment"]["data_on_device"] == "host"
    assert weights_sha256(kept.weights) == weights_sha256(moved.weights)
    # augmented on the device (the draws made on the host): the same numbers, kept or moved
    flipped = fedbug.run(cnn(augment="crop_flip"), dataset=ds)
    assert flipped.summary["environment"]["data_on_device"] == "device"
    moved = fedbug.run(cnn(augment="crop_flip", device_data_share=0.0), dataset=ds)
    assert weights_sha256(flipped.weights) == weights_sha256(moved.weights)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_trains_near_fp32(precision):
    doc = {
        "name": "cuda-digits",
        "dataset": "digits",
        "model": "digits_cnn",
        "num_clients": 10,
        "clients_per_round": 5,
        "partition": "iid",
        "rounds": 15,
        "local_epochs": 5,
        "lr": 0.05,
        "momentum": 0.9,
        "count_flops": False,
        "device": "cuda",
    }  # fp32 reaches 96.9% on the CPU
    fp32 = fedbug.run(load_config(None, doc=doc))
    half = fedbug.run(load_config(None, doc={**doc, "precision": precision}))
    assert half.summary["final_acc"] > 0.9  # it learns
    assert abs(half.summary["final_acc"] - fp32.summary["final_acc"]) <= 0.05
    assert weights_sha256(half.weights) != weights_sha256(fp32.weights)


def test_a_killed_gpu_run_resumes_to_the_uninterrupted_numbers(tmp_path):
    ds = random_images()
    cfg = cnn(algorithm="feddyn", rounds=4, checkpoint_every=1)
    whole = fedbug.run(cfg, dataset=ds)
    run_experiment(cfg, tmp_path / "run", dataset=ds, stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "run", dataset=ds, resume=True)
    assert weights_sha256(resumed.weights) == weights_sha256(whole.weights)
    assert without_timing(resumed.records) == without_timing(whole.records)


@pytest.mark.parametrize(
    ("over", "tol"),
    [
        ({}, 1e-3),
        ({"algorithm": "scaffold", "momentum": 0.9}, 1e-3),
        ({"optimizer": "adam", "lr": 0.001}, 2e-2),
        ({"cohort": {"gradient": "streams"}}, 1e-3),  # the sequential kernels, on streams
        ({"augment": "crop_flip"}, 1e-3),  # a group's batches augmented at once
    ],
)
def test_the_cohort_executor_on_the_gpu_follows_the_sequential_one(over, tol):
    """executor: cohort on the GPU: the round's clients as one vectorised step, every tensor on
    the device; one round of 2 steps (random labels at lr 0.1 amplify rounding over longer
    runs, see above). With PyTorch's own convolutions (cuDNN off) within 1e-4 of the round's
    change, as on the CPU (tests/test_cohort.py); measured on an H100 1.2e-6, 9.6e-7, 1.9e-5.
    With cuDNN, its grouped convolutions (the vmapped ones) round differently from its plain
    ones: measured 1.4e-4, 1.5e-4 and 4.5e-3 (Adam's first steps are about the gradient's sign,
    so they carry rounding in small entries furthest; the sequential GPU against the CPU 2.9e-5),
    held to 10x that scale (``benchmarks/gpu/cohort_gap.py`` prints every figure)."""
    ds = random_images()
    kw = {"rounds": 1, "local_steps": 2, "clip_grad_norm": None, **over}
    w0 = ClientSide(cnn(device="cpu", **kw), dataset=ds).initial_weights()
    with torch.backends.cudnn.flags(enabled=False):
        seq = fedbug.run(cnn(**kw), dataset=ds)
        coh = fedbug.run(cnn(executor="cohort", **kw), dataset=ds)
    native = moved_apart(coh.weights, seq.weights, w0)
    seq = fedbug.run(cnn(**kw), dataset=ds)
    coh = fedbug.run(cnn(executor="cohort", **kw), dataset=ds)
    gap = moved_apart(coh.weights, seq.weights, w0)
    print(
        f"cohort - sequential on the GPU over the round's change: {native:.1e} without cuDNN, "
        f"{gap:.1e} with it"
    )
    assert native < 1e-4
    assert gap < tol


@pytest.mark.parametrize(
    "over",
    [
        {},  # FedAvg with bottom-up unfreezing: a graph per unit set
        {"algorithm": "scaffold", "momentum": 0.9, "policy": "none"},
        {"algorithm": "feddecorr", "policy": "none"},
        # unequal clients: groups that shrink, at rows past the first (other alignment)
        {"unbalanced_sigma": 0.8, "local_steps": None, "local_epochs": 1, "partition": "iid"},
        # each client's own gradient, clients on streams: the graph's parallel branches
        {"cohort": {"gradient": "streams"}, "algorithm": "feddecorr", "policy": "none"},
    ],
)
def test_cuda_graphs_replay_the_eager_cohort_executors_numbers(over):
    """cohort: {cuda_graphs: true} replays the vectorised gradient from graphs captured at a
    shape's second use, on input buffers of the inputs' strides and alignment (so the kernels
    the eager call chooses); the numbers are the eager cohort executor's (to the bit on the CPU;
    held here within 1e-5 of the run's change, and the figure printed), and graphs were made
    (tests/test_cohort_graphs.py holds the data flow on the CPU)."""
    from fedbug.engine.executors.graphs import GraphCache

    made: list[GraphCache] = []
    init = GraphCache.__init__

    def keep(self: GraphCache, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    ds = random_images()
    kw = {"executor": "cohort", "rounds": 3, "local_steps": 6, **over}
    cohort = kw.pop("cohort", {})
    w0 = ClientSide(cnn(device="cpu", **kw), dataset=ds).initial_weights()
    eager = fedbug.run(cnn(cohort=cohort, **kw), dataset=ds)
    GraphCache.__init__ = keep  # type: ignore[method-assign]
    try:
        graphed = fedbug.run(cnn(cohort={**cohort, "cuda_graphs": True}, **kw), dataset=ds)
    finally:
        GraphCache.__init__ = init  # type: ignore[method-assign]
    gap = moved_apart(graphed.weights, eager.weights, w0)
    (cache,) = made
    print(
        f"cuda_graphs - eager cohort on the GPU over the run's change: {gap:.1e} "
        f"({len(cache.calls)} graphs, {cache.eager_calls} eager calls past the limit)"
    )
    assert cache.calls
    assert gap < 1e-5
    assert without_timing(graphed.records)[-1]["test_acc"] == pytest.approx(
        without_timing(eager.records)[-1]["test_acc"], abs=2e-3
    )


@contextlib.contextmanager
def waits_refused() -> Iterator[None]:
    """Inside, any call that makes the host wait for the GPU raises (torch.cuda's sync debug
    mode): a copy from pageable host memory, a read-back, a synchronisation."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize(
    "over",
    [
        {"optimizer": "adam", "lr": 0.001},  # Adam's bias corrections, made on the host
        {"cohort": {"cuda_graphs": True, "gradient": "streams"}, "momentum": 0.9},
        # augmented on the GPU, each client's draws moved through pinned memory
        {"augment": "crop_flip", "cohort": {"cuda_graphs": True}},
    ],
)
def test_the_cohort_executors_steps_never_wait_for_the_gpu(over, monkeypatch):
    """After the first round (captures, first counts), no group step and no drawing of a step's
    batches makes the host wait for the GPU: a copy from pageable host memory (`.to("cuda")`)
    or a read-back would, and the executor's Python would then add to the kernels' time instead
    of running ahead of them. torch.cuda's sync debug mode raises at any such call."""
    watched = cohort_steps_after_first_round(monkeypatch, waits_refused)
    fedbug.run(cnn(executor="cohort", rounds=3, local_steps=6, **over), dataset=random_images())
    assert watched() > 0


@pytest.mark.parametrize(
    "over",
    [
        {"algorithm": "fedavg"},
        {"algorithm": "fedprox"},
        {"algorithm": "feddyn"},
        {"algorithm": "scaffold"},
        {"algorithm": "fedrod", "evaluation": "personalized"},
        {"algorithm": "heterofl", "policy": "none", **method_needs("heterofl")},
        {"algorithm": "fjord", "policy": "none", **method_needs("fjord")},
        {"augment": "crop_flip"},  # its draws made on the CPU, applied on the GPU
        {"dp_sgd": {"noise_multiplier": 1.0, "clip": 1.0}},  # noise drawn on the CPU
    ],
)
def test_a_clients_local_steps_never_wait_for_the_gpu(over, monkeypatch):
    """After the first round, a client's local training under the sequential executor (its
    batches, the algorithm's terms, clipping, gradual unfreezing's unit changes, the optimiser)
    makes the host wait for the GPU nowhere: what is made on the host (FedROD's class counts,
    HeteroFL's and Fjord's sub-model masks, an augmented batch, DP-SGD's noise) reaches the
    device through pinned memory, the first two once a client, not copied with a wait every
    step (tests/test_step_reads.py checks the reads on the CPU; copies show only here)."""
    from fedbug.engine.client import LocalRound

    watched = after_first_round(monkeypatch, LocalRound, "train", local_round, waits_refused)
    fedbug.run(cnn(**over), dataset=random_images())
    assert watched[0] > 0


@pytest.mark.parametrize("algorithm", ["feddyn", "scaffold"])
def test_a_cohort_chunks_opening_never_waits_for_the_gpu(algorithm, monkeypatch):
    """A chunk's opening (each client's received weights, samples, state and the round's
    payload moved to the GPU, the chunk's stacked vectors made) queues its copies without the
    host waiting for the GPU after the first round: FedDyn's and SCAFFOLD's states and
    SCAFFOLD's payload go through pinned memory as the weights and samples do."""
    from fedbug.engine.executors.cohort import CohortExecutor

    of = lambda _ex, _weights, tasks, _states: tasks[0].round  # noqa: E731
    watched = after_first_round(monkeypatch, CohortExecutor, "open_chunk", of, waits_refused)
    doc = {"algorithm": algorithm, "rounds": 3, "local_steps": 6}
    fedbug.run(cnn(executor="cohort", **doc), dataset=random_images())
    assert watched[0] > 0
