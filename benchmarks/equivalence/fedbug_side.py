"""fedbug's side of a comparison: its public pieces driven on a scenario's inputs.

:func:`run_rounds` is a hand-built round loop (as ``tests/algorithms/test_scaffold.py``):
every client trains with :func:`fedbug.engine.client.train_client` on one
:class:`~fedbug.engine.client.ClientRuntime`, the server averages with
:class:`~fedbug.engine.aggregate.Aggregate` and moves with the algorithm's ``server_update``; it
returns
the global weights after every round. :func:`run_engine` runs the same case through
``fedbug.run`` (``partition: natural``, every client every round) and returns the final weights,
so the harness also checks that the engine does what the hand-built loop does.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import fedbug
from benchmarks.equivalence import scenario
from benchmarks.equivalence.scenario import INPUT_SHAPE, Scenario, build_model, client_data
from fedbug.algorithms import ALGORITHMS
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.policies import build_policy


@dataclass
class FedbugRun:
    space: ParamSpace
    initial: Tensor
    rounds: list[Tensor] = field(default_factory=list)  # global weights after each round
    metrics: list[dict[str, Any]] = field(default_factory=list)  # server_update's figures


def policy_of(s: Scenario) -> tuple[str, dict[str, Any]]:
    """fedbug's policy name and options block for the scenario."""
    if s.policy:
        return s.policy, dict(s.policy_params)
    if s.gu_ratio == 0:
        return "none", {}
    return "bottom_up", {"gu_ratio": s.gu_ratio}


def _policy(s: Scenario):
    name, params = policy_of(s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_policy(name, **params)


def _algorithm(s: Scenario):
    cls = ALGORITHMS.get(s.algorithm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(params=cls.params_cls(**s.params) if cls.params_cls else None)


def space_of(s: Scenario, model: torch.nn.Module | None = None) -> ParamSpace:
    model = model if model is not None else build_model(s)
    return ParamSpace(model, find_units(model, torch.zeros(1, *INPUT_SHAPE)))


def run_rounds(s: Scenario, perturb: float = 0.0) -> FedbugRun:
    """The global weights after each of ``s.rounds`` rounds, every client every round.

    ``perturb``: multiply each initial weight by 1 + perturb * N(0, 1) (seeded), to measure how
    far fedbug moves from itself when its start moves by rounding-sized amounts."""
    model = build_model(s)
    scenario.perturb(model, perturb)
    space = space_of(s, model)
    alg = _algorithm(s)
    settings = TrainSettings(
        local_steps=s.local_steps,
        batch_size=s.samples,
        weight_decay=s.weight_decay,
        clip_grad_norm=s.clip,
        count_flops=False,
    )
    rt = ClientRuntime(model, space, _policy(s), alg, settings, lambda x: x)
    clients = [ClientData(x, y) for x, y in client_data(s)]
    states = {i: alg.init_client_state(space) for i in range(s.clients)}
    weights = space.flatten(model)
    out = FedbugRun(space, weights.clone())
    server = alg.init_server_state(weights, s.clients)
    mean_samples = float(s.samples)
    for r in range(1, s.rounds + 1):
        agg = Aggregate(space, "uniform")
        for i, d in enumerate(clients):
            task = ClientTask(r, i, 0, s.lr, mean_samples, alg.payload(server), s.rounds)
            res = train_client(weights, task, d, states[i], rt)
            states[i] = res.state
            agg.add(res.delta, res.uploaded, res.num_samples, res.entries, res.extras)
        step = alg.server_update(weights, agg, server, r, s.clients)
        weights, server = step.weights, step.state
        out.rounds.append(weights.clone())
        out.metrics.append(dict(step.metrics))
    return out


def run_engine(s: Scenario) -> Tensor:
    """The final global weights of the same case run by ``fedbug.run``."""
    data = client_data(s)
    test = (data[0][0][:4], data[0][1][:4])
    dataset = fedbug.FederatedDataset.from_clients(
        "equivalence", data, test=test, num_classes=s.num_classes
    )
    doc: dict[str, Any] = {
        "name": s.name,
        "model": s.model,
        "num_clients": s.clients,
        "clients_per_round": s.clients,
        "partition": "natural",
        "augment": "none",
        "rounds": s.rounds,
        "local_steps": s.local_steps,
        "batch_size": s.samples,
        "lr": s.lr,
        "weight_decay": s.weight_decay,
        "clip_grad_norm": s.clip,
        "weighting": "uniform",
        "algorithm": s.algorithm,
        "count_flops": False,
        "eval_every": s.rounds,
        "checkpoint_every": s.rounds,
        "memory_format": "contiguous",
        "threads": torch.get_num_threads(),
    }
    if s.params:
        doc[s.algorithm] = dict(s.params)
    policy, params = policy_of(s)
    if policy != "none":
        doc["policy"] = policy
        if params:
            doc[policy] = params
    if s.model == "resnet18":
        doc["model_options"] = {"units": s.units, "stem": "imagenet"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = fedbug.config(**doc)
        result = fedbug.run(cfg, model=build_model(s), dataset=dataset)
    return result.weights


def probe(n: int) -> Tensor:
    """A fixed dense vector, r_j = cos(1.618 j) (float64), to project a unit's change on: two
    changes that differ anywhere give different projections, not only in the first values."""
    return torch.cos(torch.arange(n, dtype=torch.float64) * 1.618)


def unit_stats(space: ParamSpace, weights: Tensor, initial: Tensor) -> list[dict[str, Any]]:
    """Per unit, of the weights w: sum, L2 norm, first five values; of the change d = w - w0
    from the initial weights: sum, L2 norm, largest |d|, first five values and the projection
    on :func:`probe` (sums in float64)."""
    out = []
    for unit, sl in zip(space.units, space.unit_slices):
        w = weights[sl]
        d = w.double() - initial[sl].double()
        out.append(
            {
                "unit": unit.name,
                "numel": int(w.numel()),
                "sum": float(w.double().sum()),
                "l2": float(w.double().norm()),
                "first": [float(v) for v in w[:5]],
                "delta_sum": float(d.sum()),
                "delta_l2": float(d.norm()),
                "delta_max": float(d.abs().max()),
                "delta_first": [float(v) for v in d[:5]],
                "delta_probe": float(torch.dot(d, probe(d.numel()))),
            }
        )
    return out


def rel_diff(got: Tensor, ref: Tensor, initial: Tensor) -> dict[str, float]:
    """How far ``got`` is from ``ref`` against how far ``ref`` moved from ``initial``: max |diff|,
    max |change| and their ratio ``rel`` (0 where neither moved, inf where only ``got`` did)."""
    diff = float((got - ref).abs().max())
    moved = float((ref - initial).abs().max())
    rel = diff / moved if moved > 0 else (0.0 if diff == 0 else math.inf)
    return {"max_abs_diff": diff, "max_abs_change": moved, "rel": rel}


def unit_rows(
    space: ParamSpace, initial: Tensor, got: Tensor, ref: Tensor, units: Iterable[int] | None = None
) -> list[dict[str, Any]]:
    """Per unit (all, or the indices ``units``), its name and :func:`rel_diff` of its slice."""
    ids = range(space.num_units) if units is None else units
    rows = []
    for u in ids:
        sl = space.unit_slices[u]
        rows.append({"unit": space.units[u].name, **rel_diff(got[sl], ref[sl], initial[sl])})
    return rows


def worst_rel(rows: list[dict[str, Any]]) -> float:
    """The largest ``rel`` of :func:`unit_rows` (0 for none)."""
    return max((r["rel"] for r in rows), default=0.0)
