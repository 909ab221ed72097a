"""What the executor tests of several methods share: a config run through Flower's serialised
messages (an in-memory grid, ``executor: flower-simulation``) and the check that two runs gave
the same numbers bitwise."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from tiny import without_timing

from fedbug.engine import run_experiment


def flower_run(cfg: Any) -> Any:
    """``cfg`` run by fedbug's Flower executor over a loopback grid (skips without flwr)."""
    pytest.importorskip("flwr")
    from flowergrid import LoopbackGrid, task_identity

    from fedbug.integrations.flower.clientapp import app as client_app
    from fedbug.integrations.flower.executor import FlowerExecutor

    there_cfg = cfg.model_copy(update={"executor": "flower-simulation"})
    run_config = {"config": json.dumps(there_cfg.model_dump(mode="json"))}
    grid = LoopbackGrid(client_app, cfg.num_clients, run_config)
    with task_identity():
        return run_experiment(
            there_cfg, executor_factory=lambda exp: FlowerExecutor(grid, exp, map_once=True)
        )


def assert_same_run(got: Any, want: Any) -> None:
    """The same records (timing aside) and the same final weights, bitwise."""
    assert without_timing(got.records) == without_timing(want.records)
    assert torch.equal(got.weights, want.weights)
