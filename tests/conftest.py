"""Fixtures every test may ask for by name (pytest finds them here; plain helpers are in
``tiny.py``)."""

from collections.abc import Callable

import pytest
import torch

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
    """A run sets torch's thread count for the whole process (``threads``): every test gives it
    back, so the next one starts with the count it would have alone."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True, scope="session")
def _node_cache_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory):
    """Flower nodes the suite runs (in this process or started by it) keep their built client
    side in a folder of the session's, never in the user's ``~/.cache``."""
    import os

    before = os.environ.get("FEDBUG_NODE_CACHE")
    os.environ["FEDBUG_NODE_CACHE"] = str(tmp_path_factory.mktemp("node-cache"))
    yield
    if before is None:
        os.environ.pop("FEDBUG_NODE_CACHE", None)
    else:
        os.environ["FEDBUG_NODE_CACHE"] = before
