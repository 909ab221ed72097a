"""Fixtures the reliability drills share (pytest finds them here by name)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory) -> Path:
    """A one-round digits/mlp run that recorded round 1's two updates (about a second)."""
    from fedbug.api import run
    from fedbug.config import load_config

    sets = ["dataset=digits", "model=mlp", "num_clients=4", "clients_per_round=2", "rounds=1",
            "local_steps=1", "batch_size=2", "count_flops=false", "threads=1",
            "record_updates=[1]"]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:  # no per-run plots (most of a tiny run's time)
        for name in ("plot_run", "plot_partition"):
            mp.setattr(f"fedbug.engine.run_folder.{name}", lambda *a, **k: None)
        return run(load_config(None, sets), tmp_path_factory.mktemp("att") / "run").run_dir
