"""Fixtures every test may ask for by name (pytest finds them here; plain helpers are in
``tiny.py``)."""

import os
from collections.abc import Callable

import pytest
import torch

# The suite's numbers are the CPU's: on a machine with a GPU, ``device: auto`` (the default)
# would train there and every bit-for-bit comparison with a worker process, a Flower node or a
# recorded CPU figure would differ by rounding. So the GPU is hidden from this process and its
# children (before anything initialises CUDA) unless FEDBUG_TEST_GPU=1 asks for the GPU tests:
# ``FEDBUG_TEST_GPU=1 python -m pytest tests/test_cuda.py tests/test_golden.py`` (what
# benchmarks/gpu/check.sh runs).
GPU_TESTS = os.environ.get("FEDBUG_TEST_GPU") == "1"
if not GPU_TESTS:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

# The suite runs on two workers (``python -m pytest -n 2 --dist loadgroup``, README's command).
# Tests that start Flower or Ray deployments of their own (several processes each, some with
# timeouts and waits: a killed node's round timeout, the run lock's window) go to one worker,
# one at a time, as they ran alone before; the rest share both.
ONE_AT_A_TIME = "flower-and-ray"


def _starts_flower_or_ray(item: pytest.Item) -> bool:
    path = item.path.as_posix()
    return "/tests/flower/" in path or path.endswith("test_ray_sweep.py") or "flower" in item.name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _starts_flower_or_ray(item):
            item.add_marker(pytest.mark.xdist_group(ONE_AT_A_TIME))


# The module whose names the engine calls its per-run plots by (a run folder's accuracy.png and
# partition.png): the one place to change when the engine moves them.
PLOTS_MODULE = "fedbug.engine.run_folder"
PLOTS = ("plot_run", "plot_partition")


def _no_plot(*_args, **_kwargs) -> None:
    return None


@pytest.fixture
def stub_plot(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``stub_plot(name, fn)``: the engine calls ``fn`` (by default nothing) for its per-run
    plot ``name``, one of :data:`PLOTS`, for the rest of the test."""

    def stub(name: str, fn: Callable[..., None] = _no_plot) -> None:
        if name not in PLOTS:
            raise ValueError(f"{name!r} is not a per-run plot; plots: {PLOTS}")
        monkeypatch.setattr(f"{PLOTS_MODULE}.{name}", fn)

    return stub


@pytest.fixture
def no_plots(stub_plot: Callable[..., None]) -> None:
    """No per-run plots (most of a tiny run's time); a test that reads a plot does not ask."""
    for name in PLOTS:
        stub_plot(name)


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """Building a client side sets torch's thread count for the whole process (``threads``; a
    whole run puts it back itself): every test gives it back, so the next one starts with the
    count it would have alone."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True, scope="session")
def _node_cache_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory):
    """Flower nodes the suite runs (in this process or started by it) keep their built client
    side in a folder of the session's, never in the user's ``~/.cache``, and sign it with a
    key of the session's, never the user's ``~/.config/fedbug``."""
    names = ("FEDBUG_NODE_CACHE", "FEDBUG_CONFIG_DIR")
    before = {name: os.environ.get(name) for name in names}
    os.environ["FEDBUG_NODE_CACHE"] = str(tmp_path_factory.mktemp("node-cache"))
    os.environ["FEDBUG_CONFIG_DIR"] = str(tmp_path_factory.mktemp("config") / "fedbug")
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory):
    """A one-round digits/mlp run that recorded round 1's two updates (about a second); the
    reliability drills share it (here, not in a tests/reliability/conftest.py: a second module
    named conftest would shadow this one where a test imports it, as test_device does)."""
    from fedbug.api import run
    from fedbug.config import load_config

    sets = ["dataset=digits", "model=mlp", "num_clients=4", "clients_per_round=2", "rounds=1",
            "local_steps=1", "batch_size=2", "count_flops=false", "threads=1",
            "record_updates=[1]"]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:  # no per-run plots (most of a tiny run's time)
        for name in ("plot_run", "plot_partition"):
            mp.setattr(f"fedbug.engine.run_folder.{name}", lambda *a, **k: None)
        return run(load_config(None, sets), tmp_path_factory.mktemp("att") / "run").run_dir


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory: pytest.TempPathFactory):
    """A finished two-seed sweep (digits/mlp, 2 rounds; about 3 s) of ``sweep.yaml`` into
    ``out``, its cells ``base-s0`` and ``base-s1`` without per-run plots: the config file's
    folder. The reliability drills of ``sweep --resume`` share it."""
    import yaml

    from fedbug.cli import main

    root = tmp_path_factory.mktemp("sweep")
    doc = {"name": "s20", "dataset": "digits", "model": "mlp", "num_clients": 4,
           "clients_per_round": 2, "rounds": 2, "local_steps": 1, "batch_size": 8,
           "count_flops": False, "threads": 1}  # fmt: skip
    (root / "sweep.yaml").write_text(yaml.safe_dump(doc))
    with pytest.MonkeyPatch.context() as mp:  # no per-run plots (most of a tiny run's time)
        for name in PLOTS:
            mp.setattr(f"{PLOTS_MODULE}.{name}", _no_plot)
        argv = ["sweep", str(root / "sweep.yaml"), "--seeds", "2", "--out", str(root / "out")]
        assert main([*argv, "-q"]) == 0
    return root
