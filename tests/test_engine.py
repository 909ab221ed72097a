"""The round loop: determinism, resume, records, and every policy x algorithm pair."""

import json

import pytest
import torch
from tiny import method_needs, tiny_config, without_timing

from fedbug.algorithms import ALGORITHMS
from fedbug.engine import run_experiment
from fedbug.errors import CheckpointError, ConfigError
from fedbug.policies import POLICIES


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
@pytest.mark.parametrize("policy", POLICIES.names())
def test_every_policy_algorithm_pair_runs_two_rounds(algorithm, policy):
    evaluation = "global" if ALGORITHMS.get(algorithm).has_global_model else "personalized"
    doc = dict(
        algorithm=algorithm,
        policy=policy,
        evaluation=evaluation,
        finetune_epochs=1,
        **{"count_flops": False, **method_needs(algorithm, policy)},
    )
    if algorithm == "fjord" and policy != "none":  # ordered dropout trains every layer
        with pytest.raises(ConfigError, match="fjord trains every layer's sub-model"):
            tiny_config(**doc)
        return
    cfg = tiny_config(**doc)
    res = run_experiment(cfg)
    assert [r["round"] for r in res.records] == [1, 2]
    for r in res.records:
        assert r["test_acc"] is not None and 0.0 <= r["test_acc"] <= 1.0
        assert r["train_loss"] == r["train_loss"]  # finite, not NaN
    assert torch.isfinite(res.weights).all()


def test_same_config_and_seed_give_identical_numbers():
    cfg = tiny_config(algorithm="feddyn", policy="bottom_up", bottom_up={"gu_ratio": 0.4}, rounds=3)
    a, b = run_experiment(cfg), run_experiment(cfg)
    assert without_timing(a.records) == without_timing(b.records)
    assert torch.equal(a.weights, b.weights)
    c = run_experiment(cfg.model_copy(update={"seed": 1}))
    assert not torch.equal(a.weights, c.weights)


def test_record_fields(tmp_path):
    cfg = tiny_config(policy="fixed_head", rounds=2, eval_every=2)
    res = run_experiment(cfg, tmp_path / "run")
    r1, r2 = res.records
    assert r1["test_acc"] is None and r2["test_acc"] is not None
    for key in (
        "train_loss",
        "clients",
        "trained_params",
        "bytes_down",
        "bytes_up",
        "flops",
        "wall_time",
        "client_drift",
        "test_loss",
    ):
        assert key in r2
    assert r2["bytes_up"] < r2["bytes_down"]  # the fixed head is not uploaded
    assert r2["flops"] > 0
    files = {p.name for p in (tmp_path / "run").iterdir()}
    assert {
        "config.yaml",
        "partition.json",
        "metrics.jsonl",
        "summary.json",
        "accuracy.png",
        "checkpoint.pt",
    } <= files
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["environment"]["torch"] == torch.__version__
    for total, key in (("total_bytes_up", "bytes_up"), ("total_bytes_down", "bytes_down")):
        assert summary[total] == r1[key] + r2[key]
    assert summary["client_rounds"] == r1["num_clients"] + r2["num_clients"] == 6
    assert summary["environment"]["cpu"] and summary["environment"]["cpu_capability"]
    assert summary["config"]["seed"] == cfg.seed
    part = json.loads((tmp_path / "run" / "partition.json").read_text())
    all_idx = sorted(i for c in part["clients"] for i in c)
    assert all_idx == list(range(len(all_idx)))


@pytest.mark.parametrize("algorithm", ["feddyn", "fedexp"])
def test_resume_equals_uninterrupted(tmp_path, algorithm):
    cfg = tiny_config(
        algorithm=algorithm,
        policy="bottom_up",
        bottom_up={"gu_ratio": 0.5},
        rounds=5,
        checkpoint_every=2,
    )
    full = run_experiment(cfg, tmp_path / "full")
    part = run_experiment(cfg, tmp_path / "cut", stop_after=3)  # killed after round 3
    assert len(part.records) == 3
    # a torn last line, as a kill during a write leaves
    with open(tmp_path / "cut" / "metrics.jsonl", "a") as f:
        f.write('{"round": 4, "test_a')
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert torch.equal(resumed.weights, full.weights)
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [1, 2, 3, 4, 5]


def test_existing_run_folder_needs_resume(tmp_path):
    cfg = tiny_config(rounds=1)
    run_experiment(cfg, tmp_path / "r")
    with pytest.raises(ConfigError, match="resume=True"):
        run_experiment(cfg, tmp_path / "r")


def test_resume_with_another_config_refused(tmp_path):
    run_experiment(tiny_config(rounds=2, checkpoint_every=1), tmp_path / "r", stop_after=1)
    with pytest.raises(CheckpointError, match="another config"):
        run_experiment(tiny_config(rounds=2, lr=0.5), tmp_path / "r", resume=True)


def test_corrupt_checkpoint_refused(tmp_path):
    run_experiment(tiny_config(rounds=2, checkpoint_every=1), tmp_path / "r", stop_after=1)
    ck = tmp_path / "r" / "checkpoint.pt"
    raw = bytearray(ck.read_bytes())
    raw[-10] ^= 0xFF
    ck.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum"):
        run_experiment(tiny_config(rounds=2, checkpoint_every=1), tmp_path / "r", resume=True)


def test_participation_probability_selects_about_p():
    cfg = tiny_config(
        num_clients=40,
        clients_per_round=None,
        participation=0.25,
        rounds=8,
        local_steps=1,
        count_flops=False,
        eval_every=8,
    )
    res = run_experiment(cfg)
    counts = [r["num_clients"] for r in res.records]
    assert all(c >= 1 for c in counts)
    assert 3 <= sum(counts) / len(counts) <= 17


def test_mean_of_local_models_evaluation_by_hand_and_resume(tmp_path):
    from fedbug.engine.states import LocalModelMean

    m = LocalModelMean(torch.zeros(3), num_clients=4)
    m.update(1, torch.tensor([4.0, 0.0, 0.0]))
    m.update(2, torch.tensor([0.0, 8.0, 0.0]))
    m.update(1, torch.tensor([0.0, 0.0, 4.0]))  # client 1's latest replaces its earlier one
    torch.testing.assert_close(m.mean(), torch.tensor([0.0, 2.0, 1.0]))

    cfg = tiny_config(evaluation="mean_of_local_models", rounds=4, checkpoint_every=1)
    full = run_experiment(cfg, tmp_path / "full")
    assert "test_acc_server" in full.records[-1]
    run_experiment(cfg, tmp_path / "cut", stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)


def test_subsample_keeps_a_fixed_share_of_each_class():
    from fedbug.engine import Experiment

    full = Experiment(tiny_config())
    half = Experiment(tiny_config(subsample=0.5))
    again = Experiment(tiny_config(subsample=0.5, seed=7))
    counts_full = full.dataset.train_y.bincount()
    counts_half = half.dataset.train_y.bincount()
    assert ((counts_half - counts_full / 2).abs() <= 1).all()
    assert torch.equal(half.dataset.train_x, again.dataset.train_x)  # the same for every seed
    assert sum(len(p) for p in half.parts) == len(half.dataset.train_y)


def test_natural_clients_subset_cuts_the_test_set_to_their_samples():
    import dataclasses

    from tiny import blobs_dataset

    from fedbug.engine import Experiment

    ds = blobs_dataset(n=60)
    ds = dataclasses.replace(
        ds,
        natural_clients=[torch.arange(i * 10, (i + 1) * 10) for i in range(6)],
        natural_test_clients=[torch.arange(i * 5, (i + 1) * 5) for i in range(6)],
    )
    cfg = tiny_config(partition="natural", num_clients=3, model="mlp")
    exp = Experiment(cfg, dataset=ds)
    assert len(exp.parts) == 3
    assert len(exp.dataset.test_y) == 15
    chosen = [int(p[0]) // 10 for p in exp.parts]
    expected = torch.cat([ds.test_y[c * 5 : (c + 1) * 5] for c in chosen])
    assert torch.equal(exp.dataset.test_y, expected)
    assert [len(t) for t in exp.dataset.natural_test_clients] == [5, 5, 5]
    with pytest.raises(ConfigError, match="natural clients"):
        Experiment(tiny_config(partition="natural", num_clients=7), dataset=ds)


def test_full_aggregation_counts_unsent_units_as_unchanged():
    """FreezeFL Fig. 5: layerwise averages a unit over its senders; full over everyone."""
    from fedbug.engine import Experiment
    from fedbug.engine.aggregate import Aggregate

    space = Experiment(tiny_config()).space
    d1 = torch.ones(space.total)
    d2 = torch.ones(space.total).masked_fill(space.unit_mask([0]), 0.0)  # unit 0 frozen
    layerwise, full = Aggregate(space, "uniform"), Aggregate(space, "uniform")
    layerwise.add(d1, [True, True, True], 1)
    layerwise.add(d2, [False, True, True], 1)
    full.add(d1, [True, True, True], 1)
    full.add(d2, [True, True, True], 1)
    s0 = space.unit_slices[0]
    assert torch.equal(layerwise.mean_delta()[s0], torch.ones(space.unit_numel[0]))
    assert torch.equal(full.mean_delta()[s0], torch.full((space.unit_numel[0],), 0.5))
    # an unsent unit counts as unchanged whatever the client's copy of it did (a frozen
    # BatchNorm's running statistics drift in training; the server never sees them)
    drifted = Aggregate(space, "uniform")
    drifted.add(d1, [True, True, True], 1)
    drifted.add(torch.ones(space.total), [False, True, True], 1, counted=[True, True, True])
    assert torch.equal(drifted.mean_delta()[s0], torch.full((space.unit_numel[0],), 0.5))
    with pytest.raises(ValueError, match="'median' is not one of samples, uniform"):
        Aggregate(space, "median")  # type: ignore[arg-type]  # was a silent plain mean
    res_full = run_experiment(tiny_config(policy="fixed_head", aggregation="full", upload="full"))
    res_part = run_experiment(tiny_config(policy="fixed_head"))
    assert res_full.records[-1]["bytes_up"] > res_part.records[-1]["bytes_up"]


def test_policy_checks_count_only_the_models_own_units():
    """FedROD adds a personal head; a policy that freezes every model unit is refused up front,
    not mid-run, even though the personal head would still train."""
    from fedbug.engine import Experiment

    with pytest.raises(ConfigError, match="freezes all 3 units"):
        Experiment(
            tiny_config(algorithm="fedrod", policy="fixed_top", fixed_top={"fixed_units": 3})
        )


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_an_algorithm_whose_clients_send_sub_models_declares_it(algorithm, monkeypatch):
    """Secure aggregation refuses sub-model methods from ``sends_sub_models`` alone, before the
    run: every algorithm whose client updates hold a subset of the entries must declare it."""
    from fedbug.engine.client import LocalRound

    seen = []
    result = LocalRound.result

    def recorded(self):
        out = result(self)
        seen.append(out.entries is not None)
        return out

    monkeypatch.setattr(LocalRound, "result", recorded)
    evaluation = "global" if ALGORITHMS.get(algorithm).has_global_model else "personalized"
    doc = {"count_flops": False, "upload": "partial", **method_needs(algorithm)}
    run_experiment(tiny_config(algorithm=algorithm, evaluation=evaluation, rounds=1, **doc))
    assert seen
    if any(seen):
        assert ALGORITHMS.get(algorithm).sends_sub_models


@pytest.mark.parametrize("upload", ["partial", "full"])
def test_the_simulated_clock_charges_the_upload_the_record_counts(upload):
    """One figure for what a client sends: under ``upload: full`` the clock charged only the
    trained units (68,864 of 71,464 bytes with the CNN's fixed head) while the record counted
    the whole shared model, so round lengths and deadlines came out short."""
    cfg = tiny_config(
        policy="fixed_head", upload=upload, system={"abilities": "uniform"}, count_flops=True
    )
    res = run_experiment(cfg)
    exp_bytes = {rec["round"]: rec["bytes_up"] for rec in res.records}
    for rec in res.records:
        per_client = [c["bytes_up"] for c in rec["per_client"]]
        assert sum(per_client) == exp_bytes[rec["round"]]
        if upload == "full":
            assert len(set(per_client)) == 1 and per_client[0] == rec["bytes_down"] // 3
        else:
            assert per_client[0] < rec["bytes_down"] // 3  # the fixed head is not sent
