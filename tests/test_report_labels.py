"""``fedbug report`` over runs of no sweep (``fedbug.run`` in a loop, or separate ``fedbug run``
commands) names each group by the keys that vary; an options block counts only for the runs
whose method reads it: a FedAvg run is not labelled by FedBug's ``bottom_up.gu_ratio``, whose
default every resolved config holds (a user's first comparison read ``bottom_up.gu_ratio=0.4,
policy=none`` for FedAvg)."""

from __future__ import annotations

from typing import Any

import fedbug
from fedbug.sweeps.sweep import group_runs

BASE = {"num_clients": 4, "clients_per_round": 2, "rounds": 1, "local_steps": 1, "model": "mlp"}


def _run(tmp_path: Any, name: str, seed: int = 0, **keys: Any) -> dict[str, Any]:
    """A finished run as the report reads it (its summary's config), without training."""
    cfg = fedbug.config(**BASE, seed=seed, **keys)
    config = cfg.model_dump(mode="json")
    return {"run_dir": str(tmp_path / name), "summary": {"config": config, "seed": seed}}


def _labels(runs: list[dict[str, Any]]) -> list[str]:
    return [cell.label for cell, _ in group_runs(runs)]


def test_a_block_of_a_method_a_run_does_not_choose_is_not_in_its_label(tmp_path):
    runs = [
        _run(tmp_path, "avg", policy="none"),
        _run(tmp_path, "bug", policy="bottom_up", bottom_up={"gu_ratio": 0.5}),
        _run(tmp_path, "avg1", seed=1, policy="none"),
    ]
    # before: "bottom_up.gu_ratio=0.4, policy=none" for FedAvg (the block's unread default);
    # one FedBug setting: its policy names it
    assert _labels(runs) == ["policy=none", "policy=bottom_up"]


def test_a_block_that_varies_among_the_runs_that_read_it_still_names_them(tmp_path):
    runs = [
        _run(tmp_path, "a", policy="bottom_up", bottom_up={"gu_ratio": 0.2}),
        _run(tmp_path, "b", policy="bottom_up", bottom_up={"gu_ratio": 0.6}),
        _run(tmp_path, "c", policy="none"),
    ]
    assert _labels(runs) == [
        "bottom_up.gu_ratio=0.2, policy=bottom_up",
        "bottom_up.gu_ratio=0.6, policy=bottom_up",
        "policy=none",  # before: "bottom_up.gu_ratio=0.4, policy=none"
    ]
