"""Device and precision (issue 19), on the CPU this suite has: ``device: cpu`` given explicitly
gives today's numbers bit for bit on every executor; every tensor of local training lives on
the configured device (run on PyTorch's ``meta`` device, which refuses any CPU tensor mixed in);
bf16 autocast trains; an absent device or an impossible precision is one config error."""

from __future__ import annotations

import dataclasses
import traceback

import pytest
import torch
import yaml
from tiny import METHOD_NEEDS, TINY_DOC, tiny_config

import fedbug
from fedbug.algorithms import ALGORITHMS
from fedbug.cli import main
from fedbug.config import config_hash
from fedbug.core.protocol import ClientTask
from fedbug.engine import Experiment
from fedbug.engine.client import train_client
from fedbug.engine.evaluate import Evaluator
from fedbug.engine.simulation import Simulation
from fedbug.errors import ConfigError

#: Each registered algorithm's smallest config: what it needs (tests/tiny.py's METHOD_NEEDS),
#: and personalized evaluation for FedROD, whose own head is evaluated so.
NEEDS = {**METHOD_NEEDS, "fedrod": {"evaluation": "personalized"}}


@pytest.mark.parametrize("executor", ["sequential", "processes"])
def test_device_cpu_given_explicitly_changes_no_number(executor, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # auto: the CPU, as in CI
    # one worker: the device is the point here (tests/test_processes.py has workers' order)
    base = tiny_config(algorithm="feddyn", policy="bottom_up", executor=executor, workers=1)
    explicit = tiny_config(
        algorithm="feddyn", policy="bottom_up", executor=executor, workers=1, device="cpu"
    )
    a, b = fedbug.run(base), fedbug.run(explicit)
    assert a.summary["weights_sha256"] == b.summary["weights_sha256"]
    assert b.summary["environment"]["device"].startswith("cpu")
    assert config_hash(base) == config_hash(explicit)  # a run resumes on another device


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_local_training_never_leaves_the_configured_device(algorithm):
    """On ``meta`` every operation runs without data and a CPU tensor meeting a meta one
    raises; local training gets to the first number it must read back (the mean train loss)."""
    kw = NEEDS.get(algorithm, {})
    if not ALGORITHMS.get(algorithm).has_global_model:
        kw = {"evaluation": "personalized", **kw}
    kw = {"count_flops": False, "clip_grad_norm": 1.0, **kw}
    exp = Experiment(tiny_config(algorithm=algorithm, **kw))
    exp.device = torch.device("meta")
    rt = exp.make_runtime()
    # FLOPs are counted on the model's CPU copy, which cannot read a meta batch
    rt.settings = dataclasses.replace(rt.settings, count_flops=False)
    assert {p.device.type for p in rt.model.parameters()} == {"meta"}
    assert rt.flat.device.type == rt.grad.device.type == "meta"
    w = exp.initial_weights()
    server = exp.algorithm.init_server_state(w, exp.num_clients)
    extra = Simulation(exp).client_extra(0)  # Fjord's width
    payload = exp.algorithm.payload(server)
    task = ClientTask(1, 0, 0, 0.1, exp.mean_samples, payload, 2, extra)
    state = exp.algorithm.init_client_state(exp.space)
    with pytest.raises(RuntimeError, match="meta") as info:
        train_client(w, task, exp.client_data(0), state, rt)
    ours = [f for f in traceback.extract_tb(info.tb) if "/fedbug/" in f.filename]
    assert ours[-1].name == "result" and "float(self.loss_sum)" in ours[-1].line
    ev = Evaluator(exp.template, exp.space, exp.dataset, 64, device=torch.device("meta"))
    assert ev.flat.device.type == "meta"
    assert {p.device.type for p in ev.model.parameters()} == {"meta"}


BF16_RUN = """
import json, sys
sys.path.insert(0, {tests!r})
from tiny import tiny_config
import fedbug
from fedbug.config import config_hash
out = {{}}
for precision in ("fp32", "bf16"):
    cfg = tiny_config(rounds=6, local_steps=5, lr=0.1, count_flops=False, precision=precision,
                      device="cpu")
    res = fedbug.run(cfg)
    out[precision] = {{"losses": [r["train_loss"] for r in res.records], "hash": config_hash(cfg),
                      "acc": res.summary["final_acc"], "sha": res.summary["weights_sha256"]}}
print(json.dumps(out))
"""


def test_personalized_evaluation_and_fine_tuning_follow_the_device():
    from fedbug.engine.pfl import FinetuneSettings, PersonalizedEvaluator

    exp = Experiment(tiny_config(algorithm="fedper", evaluation="personalized"))
    meta = torch.device("meta")
    pe = PersonalizedEvaluator(
        exp.template, exp.space, exp.algorithm, exp.dataset, exp.parts, exp.test_parts,
        device=meta,
    )  # fmt: skip
    rt = pe.finetune_runtime(FinetuneSettings(epochs=1, batch_size=8, lr=0.1))
    assert pe.flat.device == rt.flat.device == rt.grad.device == meta


def test_bf16_on_the_cpu_trains_and_evaluates_near_fp32():
    """In a child process with oneDNN held below AMX (this VM advertises AMX it cannot run:
    see ``cpu_bf16_problem``), as a user of such a machine is told to start it."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX512_CORE_BF16")
    code = BF16_RUN.format(tests=str(Path(__file__).parent))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    fp32, bf16 = got["fp32"], got["bf16"]
    assert bf16["losses"][-1] < 0.8 * bf16["losses"][0]  # it learns
    assert abs(bf16["acc"] - fp32["acc"]) <= 0.05  # the stated tolerance: 5 points
    assert bf16["sha"] != fp32["sha"]  # it did compute in bf16
    assert bf16["hash"] != fp32["hash"]  # and it is another config


def test_a_cpu_that_cannot_run_bf16_is_one_config_error(monkeypatch):
    import fedbug.core.device as device

    monkeypatch.setattr(device, "cpu_bf16_problem", lambda: "it dies (a test's stand-in)")
    with pytest.raises(ConfigError, match="bf16 cannot run on this CPU: it dies"):
        fedbug.run(tiny_config(precision="bf16", device="cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**TINY_DOC, "device": "cuda"}))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no CUDA device" in err and "device: cpu" in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_fp16_on_the_cpu_and_an_unknown_device_are_refused():
    with pytest.raises(ConfigError, match="fp16 needs a GPU"):
        fedbug.run(tiny_config(precision="fp16", device="cpu"))
    with pytest.raises(ConfigError, match="device"):
        tiny_config(device="tpu")


def _gpu_of(monkeypatch, capacity: int) -> torch.device:
    """``meta`` standing in for a GPU of ``capacity`` bytes (this suite has no GPU)."""
    import fedbug.engine.dataprep as dataprep

    monkeypatch.setattr(dataprep, "memory_bytes", lambda d: capacity if d.type == "meta" else None)
    return torch.device("meta")


def test_a_data_set_that_fits_is_uploaded_once_and_clients_index_it_there(monkeypatch):
    from fedbug.engine.dataprep import place_on_device

    exp = Experiment(tiny_config())
    ds = exp.dataset
    size = sum(t.nbytes for t in (ds.train_x, ds.train_y, ds.test_x, ds.test_y))
    gpu = _gpu_of(monkeypatch, capacity=4 * size)
    placed, where = place_on_device(ds, gpu, share=0.5)
    assert where == "device"
    assert {t.device.type for t in (placed.train_x, placed.train_y, placed.test_x)} == {"meta"}
    assert ds.train_x.device.type == "cpu"  # the host's data set is untouched
    exp.device_dataset = placed
    data = exp.client_data(0)  # a client's samples: an index into the uploaded tensors
    assert data.x.device.type == data.y.device.type == "meta"
    assert data.x.shape == (len(exp.parts[0]), *ds.train_x.shape[1:])
    # more than the share of the device's memory: left on the host, moved per client
    assert place_on_device(ds, gpu, share=0.2)[1] == "host"
    assert place_on_device(ds, gpu, share=0.0)[1] == "host"
    # the CPU reads the host's tensors, and no copy is made
    assert place_on_device(ds, torch.device("cpu"), 0.5) == (ds, "host")


def test_the_run_records_where_its_data_lived_and_the_share_is_not_hashed():
    res = fedbug.run(tiny_config(device="cpu"))
    assert res.summary["environment"]["data_on_device"] == "host"
    assert config_hash(tiny_config()) == config_hash(tiny_config(device_data_share=0.0))


@pytest.fixture
def kernel_flags(monkeypatch):
    """torch's process-wide kernel flags, put back after the test; CUBLAS_WORKSPACE_CONFIG unset."""
    from fedbug.core.device import process_settings_kept

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with process_settings_kept():
        yield


def test_a_gpu_run_gets_ieee_fp32_and_deterministic_kernels(kernel_flags):
    """The flags are torch's own and settable without a GPU: what a CUDA run is given."""
    import os

    from fedbug.core.device import CUBLAS_DETERMINISTIC, configure_kernels

    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for convolutions
    got = configure_kernels(torch.device("cuda"), "fp32", deterministic=True)
    assert {k: got[k] for k in ("deterministic", "tf32")} == {"deterministic": True, "tf32": False}
    assert got["cuda"] == torch.version.cuda  # the toolkit and cuDNN it ran with
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_DETERMINISTIC

    got = configure_kernels(torch.device("cuda", 0), "tf32", deterministic=False)
    assert (got["deterministic"], got["tf32"]) == (False, True)
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_cpu_run_leaves_torchs_flags_alone(kernel_flags):
    import os

    from fedbug.core.device import configure_kernels

    torch.backends.cudnn.benchmark = True
    assert configure_kernels(torch.device("cpu"), "fp32", deterministic=True) == {}
    assert torch.backends.cudnn.benchmark and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    res = fedbug.run(tiny_config(device="cpu"))
    assert "gpu_kernels" not in res.summary["environment"]


def test_tf32_needs_a_gpu_and_is_another_config_while_deterministic_is_not_hashed():
    with pytest.raises(ConfigError, match="tf32 is NVIDIA GPUs' TensorFloat-32"):
        fedbug.run(tiny_config(precision="tf32", device="cpu"))
    assert config_hash(tiny_config(precision="tf32")) != config_hash(tiny_config())
    assert config_hash(tiny_config(deterministic=False)) == config_hash(tiny_config())


def test_worker_processes_take_the_cpu_where_the_device_is_auto(monkeypatch):
    """On a GPU machine ``device: auto`` would mean CUDA, which worker processes cannot drive:
    with ``executor: processes`` it means the CPU; ``cuda`` asked for by name is refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    side = Experiment(tiny_config(executor="processes", workers=2))
    assert side.device == torch.device("cpu")
    with pytest.raises(ConfigError, match="executor: processes runs its workers on the CPU"):
        Experiment(tiny_config(executor="processes", workers=2, device="cuda"))


def test_a_run_puts_torchs_process_settings_back(kernel_flags, monkeypatch):
    """``fedbug.run`` in a user's process: the thread count and the GPU kernel flags it set
    (here those of a CUDA run, the flags being settable without a GPU) are as before after it."""
    import os

    import fedbug.engine.experiment as experiment
    from fedbug.core.device import configure_kernels

    def as_on_a_gpu(device, precision, deterministic):
        return configure_kernels(torch.device("cuda"), "tf32", deterministic)

    monkeypatch.setattr(experiment, "configure_kernels", as_on_a_gpu)
    torch.set_num_threads(2)
    seen = {}
    fedbug.run(
        tiny_config(threads=1),
        on_round=lambda rec: seen.update(
            threads=torch.get_num_threads(), algos=torch.are_deterministic_algorithms_enabled()
        ),
    )
    assert seen == {"threads": 1, "algos": True}  # during the run: the run's
    assert torch.get_num_threads() == 2
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic and not torch.backends.cuda.matmul.allow_tf32
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_an_unpickled_client_side_sets_its_process_up_again(monkeypatch):
    """A Flower node loads its cached client side in a fresh process: the thread count and the
    GPU kernels are set there as building it sets them."""
    import pickle

    import fedbug.engine.experiment as experiment
    from fedbug.engine.experiment import ClientSide

    side = ClientSide(tiny_config(threads=1))
    calls = []
    monkeypatch.setattr(experiment, "configure_kernels", lambda *a: calls.append(a) or {"k": 1})
    torch.set_num_threads(2)
    back = pickle.loads(pickle.dumps(side))
    assert torch.get_num_threads() == 1
    assert calls == [(back.device, "fp32", True)] and back.kernels == {"k": 1}


def test_the_suite_hides_a_gpu_unless_its_tests_are_asked_for():
    """On a GPU machine the suite's CPU numbers stay the CPU's (``conftest.py``)."""
    import os

    import conftest

    if conftest.GPU_TESTS:
        pytest.skip("FEDBUG_TEST_GPU=1: the GPU is visible for its tests")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert not torch.cuda.is_available()


def test_threads_unset_follow_the_models_work_a_step_and_a_set_count_wins(monkeypatch):
    import os

    import fedbug.core.device as device
    from fedbug.core.device import default_threads
    from fedbug.engine import Experiment

    assert default_threads(5e6, 8) == 1 and default_threads(4e9, 8) == 8
    assert default_threads(None, 2) == 2  # a step the counter could not follow: every core
    assert Experiment(tiny_config()).cfg.threads == 1  # the MLP: ~1 MFLOP a step
    assert Experiment(tiny_config(threads=2)).cfg.threads == 2
    monkeypatch.setattr(device, "SMALL_STEP_FLOPS", 0.0)  # as if the MLP were a large model
    assert Experiment(tiny_config()).cfg.threads == (os.cpu_count() or 1)


@pytest.mark.parametrize(
    ("shape", "dtype", "layout"),
    [
        ((40, 3, 4, 4), torch.uint8, torch.contiguous_format),  # raw images: index_select
        ((40, 3, 4, 4), torch.float32, torch.channels_last),  # NHWC kept: indexing
        ((40,), torch.int64, torch.contiguous_format),  # labels
    ],
)
def test_take_rows_is_indexing(shape, dtype, layout) -> None:
    from fedbug.core.device import take_rows

    t = (torch.arange(torch.Size(shape).numel()) % 251).to(dtype).reshape(shape)
    t = t.contiguous(memory_format=layout) if len(shape) == 4 else t
    for idx in (torch.tensor([7, 0, 39, 7]), torch.tensor([], dtype=torch.long)):
        got, want = take_rows(t, idx), t[idx]
        assert torch.equal(got, want) and got.stride() == want.stride()
    mask = torch.arange(40) % 3 == 0
    assert torch.equal(take_rows(t, mask), t[mask])
    one = torch.tensor(5)  # a single row: its axes, not a batch of one
    assert torch.equal(take_rows(t, one), t[one]) and take_rows(t, one).shape == t[5].shape
