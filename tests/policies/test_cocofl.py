"""CoCoFL: which contiguous block each device trains (costs by hand on a tiny model), the
maximal-configuration rule, the draws (determinism, resume), refusals, and a run.

The hand-worked model is Linear(2, 4) -> Linear(4, 4) -> Linear(4, 2) (units 0, 1, 2). The
flop counter counts a linear layer's matmul, 2 x in x out per sample: 16, 32 and 16 forward. A
unit in the block adds the same again for its weight's gradient, a unit after the block's first
the same again for its input's gradient (frozen units after the block pass gradients back), so
per sample (forward 64):

    block   [0,2] [0,1] [0,0] [1,2] [1,1] [2,2]
    FLOPs    176   160   128   128   112    80
    upload   168   128    48   120    80    40   bytes (12, 20, 10 entries of 4 bytes)

With communication free (``comm_share: 0``), ``compute_speed: 16``, one sample and one epoch, a
client of ability a needs FLOPs / (16 a) time units: at a = 1, 11, 10, 8, 8, 7, 5.
"""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch
import yaml
from pydantic import ValidationError
from tiny import TINY_DOC, data, tiny_config, without_timing
from torch import nn

from fedbug.algorithms import ALGORITHMS
from fedbug.cli import main
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine import run_experiment
from fedbug.engine.client import ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.errors import ConfigError
from fedbug.policies import build_policy
from fedbug.policies.cocofl import (
    BlockCost,
    CoCoFL,
    CoCoFLParams,
    all_blocks,
    draw_block,
    maximal,
    select_blocks,
)
from fedbug.system import SystemModel, SystemParams, UnitCosts, count_per_sample_flops

FLOPS = {(0, 2): 176, (0, 1): 160, (0, 0): 128, (1, 2): 128, (1, 1): 112, (2, 2): 80}
UPLOAD = {(0, 2): 168, (0, 1): 128, (0, 0): 48, (1, 2): 120, (1, 1): 80, (2, 2): 40}


class Chain(nn.Module):
    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(2, 4)
        self.bn = nn.BatchNorm1d(4) if norm else nn.Identity()
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 2)

    def forward(self, x):
        return self.c(self.b(self.bn(self.a(x))))


def _system(abilities: list[float], norm: bool = False, sizes: list[int] | None = None):
    torch.manual_seed(0)
    model = Chain(norm)
    x, y = torch.randn(2, 2), torch.tensor([0, 1])
    units = find_units(model, x)
    space = ParamSpace(model, units)
    params = SystemParams(abilities="none", compute_speed=16.0, comm_share=0.0)
    per_sample = count_per_sample_flops(model, units, x, y)
    n = len(abilities)
    system = SystemModel(
        params,
        space,
        per_sample,
        sizes or [1] * n,
        1,
        n,
        0,
        unit_costs=UnitCosts(model, units, x, y),
    )
    system.abilities = torch.tensor(abilities, dtype=torch.float64)
    return system


CFG = SimpleNamespace(aggregation="full", optimizer="sgd", momentum=0.0, batch_size=2)


def _policy(system, cfg=CFG, **options) -> CoCoFL:
    policy = build_policy("cocofl", **options)
    policy.setup_server(system, cfg)
    return policy


def _choices(policy: CoCoFL, client: int, round: int = 1) -> list[tuple[int, int]]:
    conf = policy.client_config(client)["cocofl"]
    return draw_block(conf["blocks"], conf["data"], 0, round, client)[2]


# -- the costs and the rule --------------------------------------------------------------


def test_block_costs_are_counted_as_worked_by_hand():
    system = _system([1.0])
    for (lo, hi), flops in FLOPS.items():
        assert system.unit_costs.flops(range(lo, hi + 1)) == flops
        assert system.upload_bytes_of(range(lo, hi + 1)) == UPLOAD[(lo, hi)]
    assert system.upload_bytes_of(range(1, 3)) == system.upload_bytes[1]  # a suffix: as before
    policy = _policy(system, deadline=11.0)
    times = dict(zip(all_blocks(3), policy._time[0].tolist()))
    assert times == pytest.approx({b: f / 16 for b, f in FLOPS.items()})


def test_maximal_keeps_the_blocks_no_other_contains():
    assert maximal([(0, 0), (1, 2), (1, 1), (2, 2)]) == [(0, 0), (1, 2)]
    assert maximal([(0, 0), (1, 1), (2, 2), (1, 1)]) == [(0, 0), (1, 1), (2, 2)]
    assert maximal([(0, 2), (0, 0), (1, 2)]) == [(0, 2)]
    assert maximal([]) == []


def test_select_blocks_filters_all_three_limits_then_keeps_the_maximal():
    table = [
        BlockCost(0, 2, 1.0, 1.0, 1.0),
        BlockCost(0, 1, 0.8, 0.9, 0.7),
        BlockCost(1, 2, 0.7, 0.5, 0.9),
        BlockCost(1, 1, 0.5, 0.4, 0.5),
        BlockCost(2, 2, 0.3, 0.2, 0.4),
    ]
    assert select_blocks(table, 1.0, 1.0, 1.0) == [(0, 2)]
    assert select_blocks(table, 0.9, 1.0, 1.0) == [(0, 1), (1, 2)]
    assert select_blocks(table, 0.9, 0.6, 1.0) == [(1, 2)]  # (0, 1) sends too much
    assert select_blocks(table, 0.9, 0.6, 0.8) == [(1, 1), (2, 2)]  # (1, 2) needs memory
    assert select_blocks(table, 0.2, 1.0, 1.0) == []


# -- which block each device gets ----------------------------------------------------------


def test_each_device_draws_among_its_largest_blocks_within_the_deadline():
    # T = 8: ability 1 fits (0,0), (1,2), (1,1), (2,2), of which (0,0) and (1,2) are maximal;
    # ability 2 fits everything (the full model, 5.5)
    policy = _policy(_system([1.0, 2.0]), deadline=8.0)
    assert policy.deadline == 8.0 and policy.round_deadline() == 8.0
    assert _choices(policy, 0) == [(0, 0), (1, 2)]
    assert _choices(policy, 1) == [(0, 2)]
    rows = policy.client_config(0)["cocofl"]["blocks"]
    assert [tuple(r[:2]) for r in rows] == [(0, 0), (1, 1), (1, 2), (2, 2)]
    assert [r[2] for r in rows] == pytest.approx([48 / 168, 80 / 168, 120 / 168, 40 / 168])


def test_unset_deadline_is_the_shortest_every_client_meets():
    # ability 0.5 needs 10 for its cheapest block (2,2): T = 10, where ability 1 also fits (0,1)
    policy = _policy(_system([1.0, 2.0, 0.5]))
    assert policy.deadline == pytest.approx(10.0)
    assert _choices(policy, 0) == [(0, 1), (1, 2)]
    assert _choices(policy, 1) == [(0, 2)]
    assert _choices(policy, 2) == [(2, 2)]


def test_data_limit_drops_the_blocks_that_send_too_much():
    # data 0.5: of 48, 80, 40 and 128/120/168 bytes over 168 only (0,0), (1,1), (2,2) fit
    policy = _policy(_system([2.0]), deadline=8.0, data=0.5)
    assert _choices(policy, 0) == [(0, 0), (1, 1), (2, 2)]


def test_memory_limit_drops_the_blocks_that_need_more():
    system = _system([2.0])
    costs = system.unit_costs
    mem = {b: costs.memory(range(b[0], b[1] + 1), 2, 0) for b in all_blocks(3)}
    # the full block holds the most; just below it, the largest two-unit blocks remain
    limit = max(v for b, v in mem.items() if b != (0, 2)) / mem[(0, 2)]
    assert limit < 1
    policy = _policy(system, deadline=8.0, memory=limit)
    assert _choices(policy, 0) == [(0, 1), (1, 2)]


def test_a_data_range_is_drawn_per_round_and_client():
    policy = _policy(_system([2.0, 2.0]), deadline=8.0, data=[0.25, 1.0])
    limits = set()
    for r in range(1, 40):
        for k in (0, 1):
            conf = policy.client_config(k)["cocofl"]
            limit, block, choices = draw_block(conf["blocks"], conf["data"], 3, r, k)
            assert 0.25 <= limit <= 1.0 and block in choices
            fits = [b for b in all_blocks(3) if UPLOAD[b] / 168 <= limit]
            assert choices == maximal(fits)
            limits.add(round(limit, 6))
    assert len(limits) == 78  # a fresh draw every time


# -- determinism and resume ----------------------------------------------------------------


def test_the_draw_is_a_function_of_seed_round_and_client():
    policy = _policy(_system([1.0]), deadline=8.0)
    conf = policy.client_config(0)["cocofl"]
    picks = [draw_block(conf["blocks"], conf["data"], 0, r, 0)[1] for r in range(1, 41)]
    again = [draw_block(conf["blocks"], conf["data"], 0, r, 0)[1] for r in range(1, 41)]
    assert picks == again
    assert set(picks) == {(0, 0), (1, 2)}  # both maximal blocks come up
    other = [draw_block(conf["blocks"], conf["data"], 1, r, 0)[1] for r in range(1, 41)]
    assert other != picks


def _run_cfg(**over):
    doc = dict(
        policy="cocofl",
        count_flops=True,
        system={"abilities": "uniform", "ability_min": 0.3, "ability_max": 3.0},
        aggregation="full",
        weighting="uniform",
        threads=1,
    )
    doc.update(over)
    return tiny_config(**doc)


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path):
    cfg = _run_cfg(rounds=3, checkpoint_every=1, cocofl={"data": [0.5, 1.0]})
    full = run_experiment(cfg, tmp_path / "full")
    run_experiment(cfg, tmp_path / "cut", stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert torch.equal(resumed.weights, full.weights)


# -- a run -----------------------------------------------------------------------------------


def test_a_device_moves_and_sends_only_its_block():
    torch.manual_seed(0)
    model = Chain()
    units = find_units(model, torch.zeros(1, 2))
    space = ParamSpace(model, units)
    settings = TrainSettings(local_steps=2, batch_size=2, weight_decay=0.0, count_flops=False)
    rt = ClientRuntime(model, space, CoCoFL(), ALGORITHMS.get("fedavg")(), settings, lambda x: x)
    w0 = space.flatten(model)
    extra = {"cocofl": {"blocks": [[1, 1, 0.5]], "data": [1.0, 1.0]}}
    task = ClientTask(1, 0, 0, 0.1, 2.0, extra=extra)
    res = train_client(w0, task, data([[1.0, 2.0], [-1.0, 0.5]], [0, 1]), {}, rt)
    moved = [bool(res.delta[s].abs().sum() > 0) for s in space.unit_slices]
    assert moved == [False, True, False]
    assert res.uploaded == [False, True, False] and res.bytes_up == 80
    assert res.figures == {"block_lo": 1, "block_hi": 1, "n_frozen": 2}


def test_a_run_charges_each_client_at_most_the_deadline():
    res = run_experiment(_run_cfg(cocofl={"deadline": 2.0}))
    clients = [c for r in res.records for c in r["per_client"]]
    assert clients and all(c["time"] <= 2.0 * (1 + 1e-9) for c in clients)
    assert all(r["soft_deadline"] == 2.0 for r in res.records)
    assert {(c["block_lo"], c["block_hi"]) for c in clients} != {(0, 2)}  # some froze units
    for c in clients:
        assert c["n_frozen"] == 3 - (c["block_hi"] - c["block_lo"] + 1)


@pytest.mark.slow
def test_processes_give_the_in_process_numbers():
    cfg = _run_cfg(cocofl={"deadline": 2.0, "data": [0.5, 1.0]})
    seq = run_experiment(cfg)
    par = run_experiment(cfg.model_copy(update={"executor": "processes", "workers": 2}))
    assert without_timing(par.records) == without_timing(seq.records)
    assert torch.equal(par.weights, seq.weights)


def test_flowers_message_path_gives_the_in_process_numbers():
    """task.extra travels as JSON there: the blocks come back as lists, the draw is the same."""
    pytest.importorskip("flwr")
    from flowergrid import LoopbackGrid, task_identity

    from fedbug.integrations.flower.clientapp import app as client_app
    from fedbug.integrations.flower.executor import FlowerExecutor

    cfg = _run_cfg(cocofl={"deadline": 2.0, "data": [0.5, 1.0]})
    here = run_experiment(cfg)
    there_cfg = cfg.model_copy(update={"executor": "flower-simulation"})
    run_config = {"config": json.dumps(there_cfg.model_dump(mode="json"))}
    grid = LoopbackGrid(client_app, cfg.num_clients, run_config)
    with task_identity(), warnings.catch_warnings():
        there = run_experiment(
            there_cfg, executor_factory=lambda exp: FlowerExecutor(grid, exp, map_once=True)
        )
    assert without_timing(there.records) == without_timing(here.records)
    assert torch.equal(there.weights, here.weights)


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "fix"),
    [
        ({"system": None}, "needs a system: block"),
        ({"system": {"cost": "measured"}}, "set system.cost: flops"),
        ({"upload": "full"}, "set upload: partial"),
    ],
)
def test_config_refusals_name_the_key_and_the_fix(over, fix):
    with pytest.raises(ConfigError, match=f"policy: cocofl .*{fix}"):
        _run_cfg(**over)


def test_a_missing_system_block_is_refused_with_an_example_of_one():
    with pytest.raises(ConfigError) as exc:
        _run_cfg(system=None)
    assert str(exc.value) == (
        "invalid config: policy: cocofl needs a system: block (the devices whose limits choose "
        "blocks), e.g. system: {abilities: uniform}"
    )


@pytest.mark.parametrize(
    "bad", [{"data": 0.0}, {"data": [0.9, 0.5]}, {"memory": 1.5}, {"deadline": -1.0}]
)
def test_bad_limits_are_refused(bad):
    with pytest.raises(ValidationError):
        CoCoFLParams(**bad)
    with pytest.raises(ConfigError, match="cocofl"):
        _run_cfg(cocofl=bad)


def test_a_budget_no_block_fits_is_one_line_naming_the_key():
    system = _system([1.0, 0.5])
    with pytest.raises(ConfigError, match=r"cocofl.deadline=8 is too short for client 1, whose "
                       r"cheapest block \(units 2..2\) takes 10 time units; raise cocofl.deadline "
                       r"to at least 10"):  # fmt: skip
        _policy(system, deadline=8.0)
    with pytest.raises(ConfigError, match=r"cocofl.data=0.2 .*raise cocofl.memory or cocofl.data"):
        _policy(system, data=0.2)  # the smallest upload is 40 / 168 = 0.238
    with pytest.raises(ConfigError, match="cocofl.memory=0.01"):
        _policy(system, memory=0.01)


def test_running_statistics_are_served_under_either_aggregation():
    """A frozen BatchNorm's drifting statistics are never sent, and under aggregation: full an
    unsent unit counts as unchanged (tests/test_engine.py), so nothing need be refused."""
    assert _policy(_system([1.0], norm=True)).deadline is not None
    layerwise = SimpleNamespace(**{**vars(CFG), "aggregation": "layerwise"})
    assert _policy(_system([1.0], norm=True), layerwise).deadline is not None


def test_the_cli_exits_2_on_a_budget_no_block_fits(tmp_path, capsys):
    doc = {**TINY_DOC, "policy": "cocofl", "count_flops": True, "system": {}, "cocofl": {
        "deadline": 1e-6}}  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--out", str(tmp_path / "runs"), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "raise cocofl.deadline to at least" in err[0]
