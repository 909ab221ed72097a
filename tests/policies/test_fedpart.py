"""FedPart (Wang et al., NeurIPS 2024): the round -> units schedule worked by hand for each option,
the refusals, and runs in which a partial round moves, and sends, only its scheduled unit (in
process, in worker processes and through Flower's message path, with the same numbers)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from tiny import tiny_config, without_timing

from fedbug.cli import main
from fedbug.config import load_config
from fedbug.engine import Experiment, run_experiment
from fedbug.errors import ConfigError
from fedbug.policies import StepCtx, build_policy
from fedbug.policies.fedpart import group_order


def table(num_units: int, rounds: int, **options) -> list[tuple[int, ...]]:
    """The units every client trains in rounds 1..``rounds`` (any step: the same)."""
    p = build_policy("fedpart", **options)
    return [tuple(p.trainable_units(StepCtx(1, 1, num_units, r))) for r in range(1, rounds + 1)]


ALL3 = (0, 1, 2)
DEMO = Path(__file__).resolve().parents[2] / "configs" / "digits-demo.yaml"


def test_defaults_warm_up_then_two_rounds_per_unit_and_five_full_rounds_between_cycles():
    # M = 3: rounds 1-5 full; 6-11 units 0,0,1,1,2,2; 12-16 full; 17-22 the second cycle
    expected = [ALL3] * 5 + [(0,), (0,), (1,), (1,), (2,), (2,)] + [ALL3] * 5
    expected += [(0,), (0,), (1,), (1,), (2,), (2,), ALL3]
    assert table(3, 23) == expected


def test_every_step_of_a_round_trains_the_same_units():
    p = build_policy("fedpart", warmup=0, rounds_per_unit=1, full_between=0)
    assert {tuple(p.trainable_units(StepCtx(k, 7, 4, 3))) for k in range(1, 8)} == {(2,)}


def test_reverse_order_goes_deep_to_shallow():
    got = table(3, 8, warmup=1, rounds_per_unit=1, full_between=0, order="reverse")
    assert got == [ALL3, (2,), (1,), (0,), (2,), (1,), (0,), (2,)]


def test_v_order_goes_shallow_to_deep_and_back_each_end_once():
    got = table(4, 9, warmup=0, rounds_per_unit=1, full_between=0, order="v")
    assert got == [(0,), (1,), (2,), (3,), (2,), (1,), (0,), (1,), (2,)]
    assert group_order(4, "v") == (0, 1, 2, 3, 2, 1)
    assert group_order(2, "v") == (0, 1)
    assert group_order(1, "v") == (0,)  # Fling's V divides by zero here


def test_v_cycles_are_separated_by_full_rounds():
    got = table(3, 9, warmup=0, rounds_per_unit=1, full_between=2, order="v")
    assert got == [(0,), (1,), (2,), (1,), ALL3, ALL3, (0,), (1,), (2,)]


def test_groups_of_two_units_the_last_one_shorter():
    # M = 5, two units a round: groups (0,1), (2,3), (4,); one full round between cycles
    got = table(5, 9, warmup=0, rounds_per_unit=1, full_between=1, units_per_round=2)
    everything = (0, 1, 2, 3, 4)
    assert got == [(0, 1), (2, 3), (4,), everything, (0, 1), (2, 3), (4,), everything, (0, 1)]


def test_base_variant_cycles_without_full_rounds():
    got = table(2, 10, warmup=5, full_between=0)
    assert got == [(0, 1)] * 5 + [(0,), (0,), (1,), (1,), (0,)]


def test_cycles_end_in_full_rounds_and_null_keeps_cycling():
    opts = dict(warmup=1, rounds_per_unit=1, full_between=2)
    both = (0, 1)
    # one cycle (rounds 2-3), then the full network for good
    assert table(2, 8, cycles=1, **opts) == [both, (0,), (1,)] + [both] * 5
    # null: full rounds 4-5, then the next cycle
    assert table(2, 8, **opts) == [both, (0,), (1,), both, both, (0,), (1,), both]


def test_flings_resnet8_schedule_in_closed_form_and_past_its_end():
    """Fling's hard-coded FedPart(Repeat) for 10 groups: r (0-based) < 5 full; then group q // 2
    where q = (r - 5) mod 25 < 20, else full, for 5 cycles (rounds 0-124). Past 124 its code
    stops; cycles: 5 trains the full network there, cycles: null goes on cycling."""
    code = dict(rounds_per_unit=2, warmup=5, full_between=5)
    five = table(10, 150, cycles=5, **code)
    forever = table(10, 150, **code)
    for r in range(150):
        q = (r - 5) % 25
        fling = None if r < 5 or q >= 20 else q // 2
        if r < 125:
            assert five[r] == forever[r] == (tuple(range(10)) if fling is None else (fling,)), r
        else:
            assert five[r] == tuple(range(10))
            assert forever[r] == (tuple(range(10)) if fling is None else (fling,)), r


@pytest.mark.parametrize(
    "block, match",
    [
        ({"rounds_per_unit": 0}, "rounds_per_unit"),
        ({"warmup": -1}, "warmup"),
        ({"cycles": 0}, "cycles"),
        ({"order": "zigzag"}, "order"),
        ({"units_per_round": 0}, "units_per_round"),
        ({"layers": 2}, "layers"),
    ],
)
def test_bad_options_are_refused_naming_the_key(block, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, doc={"policy": "fedpart", "fedpart": block})


def test_a_group_wider_than_the_model_is_refused_where_the_units_are_known():
    with pytest.raises(ConfigError, match=r"fedpart.units_per_round=4 .* 3 units; use 1..3"):
        Experiment(tiny_config(policy="fedpart", fedpart={"units_per_round": 4}))
    p = build_policy("fedpart", units_per_round=4)
    with pytest.raises(ConfigError, match="fedpart.units_per_round"):
        p.trainable_units(StepCtx(1, 1, 3, 9))


def test_a_group_of_every_unit_warns_that_it_is_fedavg():
    with pytest.warns(UserWarning, match="it is FedAvg"):
        Experiment(tiny_config(policy="fedpart", fedpart={"units_per_round": 3}))


def test_a_fedseq_schedule_on_top_is_refused():
    with pytest.raises(ConfigError, match="schedule: none"):
        tiny_config(policy="fedpart", schedule="vanilla")


@pytest.mark.parametrize(
    "sets, words",
    [
        (["fedpart.units_per_round=40"], ["fedpart.units_per_round=40", "5 units", "1..5"]),
        (["fedpart.order=zigzag"], ["fedpart.order", "'v'"]),
        (["fedpart.rounds_per_unit=0"], ["fedpart.rounds_per_unit"]),
    ],
)
def test_the_cli_gives_a_bad_option_one_line_and_exit_2(tmp_path, capsys, sets, words):
    flags = [f for s in ["policy=fedpart", "rounds=1", *sets] for f in ("-s", s)]
    rc = main(["run", str(DEMO), *flags, "--out", str(tmp_path), "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("fedbug: error: "), lines
    assert all(w in lines[0] for w in words), lines[0]


def test_its_block_without_the_policy_is_refused():
    with pytest.raises(ConfigError, match="fedpart: has no effect under policy: none"):
        tiny_config(fedpart={"warmup": 0})


# -- runs --------------------------------------------------------------------------------------
#: round 1 the full network, round 2 unit 0 (hidden.0), round 3 unit 1 (hidden.1)
PARTIAL = {"warmup": 1, "rounds_per_unit": 1, "full_between": 0}


def _cfg(**overrides):
    doc = dict(policy="fedpart", fedpart=PARTIAL, rounds=3, threads=1, count_flops=False)
    doc.update(overrides)
    return tiny_config(**doc)


def _units(exp: Experiment, w: torch.Tensor) -> list[torch.Tensor]:
    return [w[s] for s in exp.space.unit_slices]


def test_a_partial_round_moves_and_sends_only_its_unit():
    cfg = _cfg()
    exp = Experiment(cfg)
    numel = exp.space.unit_numel
    runs = [run_experiment(cfg, stop_after=r) for r in (1, 2, 3)]
    w = [_units(exp, exp.initial_weights())] + [_units(exp, r.weights) for r in runs]
    moved = [[not torch.equal(a, b) for a, b in zip(w[r - 1], w[r])] for r in (1, 2, 3)]
    assert moved == [[True, True, True], [True, False, False], [False, True, False]]
    records = runs[-1].records
    assert [r["num_clients"] for r in records] == [3, 3, 3]
    trained = [sum(numel), numel[0], numel[1]]
    assert [r["trained_params"] for r in records] == trained
    assert [r["bytes_up"] for r in records] == [3 * 4 * n for n in trained]  # float32, 3 clients
    # the base sub-layers (hidden.0, hidden.1; the classifier is the head) each round trains
    assert [r["trained_sublayers"] for r in records] == [[1, 2], [1], [2]]
    assert all(r["bytes_down"] == 3 * 4 * sum(numel) for r in records)  # the whole model down


def test_the_head_round_records_no_base_sublayer():
    res = run_experiment(_cfg(rounds=4), stop_after=4)
    assert [r["trained_sublayers"] for r in res.records] == [[1, 2], [1], [2], []]


@pytest.mark.slow
def test_worker_processes_give_the_in_process_numbers():
    cfg = _cfg()
    seq = run_experiment(cfg)
    par = run_experiment(cfg.model_copy(update={"executor": "processes", "workers": 2}))
    assert without_timing(par.records) == without_timing(seq.records)
    assert torch.equal(par.weights, seq.weights)


def test_flowers_message_path_gives_the_in_process_numbers():
    pytest.importorskip("flwr")
    import json

    from flowergrid import LoopbackGrid, task_identity

    from fedbug.integrations.flower.clientapp import app as client_app
    from fedbug.integrations.flower.executor import FlowerExecutor

    cfg = _cfg()
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
