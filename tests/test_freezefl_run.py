"""FreezeFL through the engine: simulated devices, freezing, selection, records, resume."""

import pytest
from tiny import method_needs, tiny_config, without_timing

from fedbug.algorithms import ALGORITHMS
from fedbug.config import load_config
from fedbug.engine import run_experiment
from fedbug.errors import ConfigError

SYSTEM = {"abilities": "uniform", "ability_min": 0.5, "ability_max": 3.0}


def _cfg(**kw):
    base = dict(
        num_clients=12,
        clients_per_round=4,
        local_steps=None,
        local_epochs=3,
        batch_size=16,
        rounds=3,
        system=SYSTEM,
        checkpoint_every=1,
    )
    base.update(kw)
    return tiny_config(**base)


def test_records_and_freezing():
    res = run_experiment(_cfg(method="freezefl", freezefl={"beta": 50.0, "T0": 0.2}))
    r = res.records[-1]
    for key in ("round_length", "sim_clock", "soft_deadline", "per_client"):
        assert key in r
    assert r["round_length"] == max(c["time"] for c in r["per_client"])
    assert res.records[1]["sim_clock"] == pytest.approx(
        res.records[0]["round_length"] + res.records[1]["round_length"]
    )
    frozen = [c["n_frozen"] for rec in res.records for c in rec["per_client"]]
    assert any(n > 0 for n in frozen)
    for rec in res.records:
        for c in rec["per_client"]:
            assert {"id", "ability", "n_frozen", "bytes_up", "flops", "time", "utility"} <= set(c)
            assert 0.5 <= c["ability"] <= 3.0
    assert res.summary["clients"]["participations"].count(0) < 12


def test_freezing_with_beta_zero_is_fedavg():
    a = run_experiment(_cfg(method="freezing", freezefl={"beta": 0.0}))
    b = run_experiment(_cfg(algorithm="fedavg"))
    assert [r["test_acc"] for r in a.records] == [r["test_acc"] for r in b.records]
    assert [r["round_length"] for r in a.records] == pytest.approx(
        [r["round_length"] for r in b.records], rel=1e-9
    )
    assert all(c["n_frozen"] == 0 for r in a.records for c in r["per_client"])


def test_resume_equals_uninterrupted(tmp_path):
    cfg = _cfg(
        method="freezefl",
        freezefl={"beta": 50.0, "T0": 0.2},
        reputation={"warm_restart": 2},
        rounds=4,
    )
    full = run_experiment(cfg, tmp_path / "full")
    run_experiment(cfg, tmp_path / "cut", stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)


def test_rbcsf_runs_and_needs_a_system():
    res = run_experiment(_cfg(method="rbcsf"))
    assert all(len(r["clients"]) == 4 for r in res.records)
    with pytest.raises(Exception, match="system"):
        run_experiment(_cfg(method="rbcsf", system=None))


def test_digits_config_freezes():
    cfg = load_config("configs/cpu/freezefl-digits.yaml", ["rounds=4"])
    res = run_experiment(cfg)
    assert any(c["n_frozen"] > 0 for r in res.records for c in r["per_client"])


@pytest.mark.parametrize(
    "override",
    [
        "freezefl.beta=-1",
        "freezefl.T0=0",
        "freezefl.deadline_ema=1.5",
        "reputation.warm_restart=-1",
        "system.ability_min=0",
        "system.ability_min=4",
        "clients_per_round=99",
    ],
)
def test_bad_settings_are_config_errors(override):
    from fedbug.errors import ConfigError

    with pytest.raises(ConfigError):
        load_config("configs/cpu/freezefl-digits.yaml", [override])


def test_client_accuracy_beside_the_global_model():
    res = run_experiment(_cfg(method="freezefl", pfl_test="holdout", test_fraction=0.1))
    r = res.records[-1]
    assert 0.0 <= r["acc_client_mean"] <= 1.0 and r["test_acc"] is not None
    assert "pfl" not in res.summary  # no fine-tuning without personalized evaluation


PERSONAL = {"evaluation": "personalized", "partition": "dirichlet_classwise", "finetune_epochs": 1}


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_freezefl_with_every_algorithm_runs_or_is_refused_with_its_reason(algorithm):
    alg = ALGORITHMS.get(algorithm)
    kw = {} if alg.has_global_model else PERSONAL
    cfg = dict(method="freezefl", algorithm=algorithm, rounds=2, freezefl={"beta": 50.0, "T0": 0.2})
    if algorithm == "fjord":  # trains every layer's sub-model
        with pytest.raises(ConfigError, match="use policy: none"):
            _cfg(**cfg, **kw)
        return
    kw = {**kw, **method_needs(algorithm)}
    res = run_experiment(_cfg(**cfg, **kw))
    per_client = [c for r in res.records for c in r["per_client"]]
    assert any(c["n_frozen"] > 0 for c in per_client)  # the deadline is tight: clients freeze
    for c in per_client:
        assert c["time"] > 0 and c["bytes_up"] >= 0
