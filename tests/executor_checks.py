"""What the executor tests of several methods share: a config run through Flower's serialised
messages (an in-memory grid, ``executor: flower-simulation``), the check that two runs gave
the same numbers bitwise, and a method watched from the second round on."""

from __future__ import annotations

import json
from collections.abc import Callable
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


def after_first_round(
    monkeypatch: Any, cls: type, name: str, round_of: Callable[..., int], context: Callable[[], Any]
) -> list[int]:
    """Patch ``cls.name`` to run inside ``context()`` from the second round on (the first makes
    caches and graphs), the round read from the call by ``round_of(self, *args)``; returns a
    one-item list counting the calls so watched."""
    inner = getattr(cls, name)
    first: list[int] = []
    watched = [0]

    def call(self: Any, *args: Any) -> Any:
        first[:] = first or [round_of(self, *args)]
        if round_of(self, *args) == first[0]:
            return inner(self, *args)
        watched[0] += 1
        with context():
            return inner(self, *args)

    monkeypatch.setattr(cls, name, call)
    return watched


def local_round(local: Any) -> int:
    """The round of a ``LocalRound`` (its ``train`` watched with :func:`after_first_round`)."""
    return local.task.round


def cohort_steps_after_first_round(
    monkeypatch: Any, context: Callable[[], Any]
) -> Callable[[], int]:
    """The cohort executor's ``group_step`` and ``next_step`` run inside ``context()`` from the
    second round on; returns how many calls were so watched, when called."""
    from fedbug.engine.executors.cohort import CohortExecutor

    def chunk_round(_ex: Any, c: Any, _x: Any, chunk: Any) -> int:  # c: a client, or a group's
        return chunk.rounds[c if isinstance(c, int) else c[0]].task.round

    watched = [
        after_first_round(monkeypatch, CohortExecutor, name, chunk_round, context)
        for name in ("group_step", "next_step")
    ]
    return lambda: sum(w[0] for w in watched)
