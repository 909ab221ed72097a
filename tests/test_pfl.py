"""Personalized evaluation and fine-tuning (FedSeq Algorithm 1, lines 20-26)."""

import pytest
import torch
from tiny import method_needs, tiny_config

from fedbug.algorithms import ALGORITHMS
from fedbug.engine import Experiment, run_experiment
from fedbug.engine.pfl import ClientScore, FinetuneSettings, summarise
from fedbug.engine.states import ClientStates
from fedbug.errors import ConfigError
from fedbug.policies.freezefl import charged_times

PFL = {"evaluation": "personalized", "partition": "dirichlet_classwise", "finetune_epochs": 1}


def test_summary_leaves_out_clients_without_test_samples():
    scores = [ClientScore(0, 10, 4, 3), ClientScore(1, 10, 0, 0), ClientScore(2, 10, 2, 1)]
    s = summarise(scores)
    assert s["mean"] == pytest.approx((0.75 + 0.5) / 2)
    assert s["std"] == pytest.approx(0.125)
    assert s["weighted"] == pytest.approx(4 / 6)


def test_finetuning_touches_no_other_client_and_not_the_global_model():
    exp = Experiment(tiny_config(algorithm="fedper", num_clients=5, **PFL))
    weights = exp.initial_weights()
    before = weights.clone()
    states = ClientStates(exp.algorithm, exp.space)
    head = exp.layout.head[0]
    for i in range(5):  # give every client its own head
        states.put(i, {f"local.{head}": torch.full((exp.space.unit_numel[head],), 0.01 * i)})
    snapshot = {i: {k: v.clone() for k, v in states.get(i).items()} for i in range(5)}
    settings = FinetuneSettings(epochs=2, lr=0.05, batch_size=8)
    forward = exp.personal.finetune(weights, states.get, settings, seed=0)
    backward = exp.personal.finetune(weights, states.get, settings, seed=0, clients=[4, 2, 0, 3, 1])
    by_client = {s.client: s.correct for s in backward}
    assert [s.correct for s in forward] == [by_client[i] for i in range(5)]
    assert torch.equal(weights, before)
    for i in range(5):
        for k, v in states.get(i).items():
            assert torch.equal(v, snapshot[i][k])


def test_same_seed_same_per_client_accuracies_before_and_after(tmp_path):
    cfg = tiny_config(method="fedseq-anti", rounds=3, num_clients=6, **PFL)
    a = run_experiment(cfg, tmp_path / "a")
    b = run_experiment(cfg)
    assert a.summary["pfl"]["clients"] == b.summary["pfl"]["clients"]
    rows = a.summary["pfl"]["clients"]
    assert len(rows) == 6 and {"acc_before_ft", "acc_after_ft", "n_train", "n_test"} <= set(rows[0])
    assert (tmp_path / "a" / "clients.csv").read_text().count("\n") == 7
    assert (tmp_path / "a" / "clients.png").exists()
    assert a.records[-1]["acc_client_mean"] == pytest.approx(a.summary["pfl"]["before_ft"]["mean"])


@pytest.mark.parametrize("schedule", ["none", "vanilla", "anti"])
@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_every_algorithm_and_schedule_runs_two_rounds_and_finetunes(algorithm, schedule):
    if algorithm == "fjord":  # needs the simulated devices; trains every layer's sub-model
        doc = dict(algorithm=algorithm, schedule=schedule, system={"abilities": "uniform"}, **PFL)
        if schedule != "none":
            with pytest.raises(ConfigError, match="fjord trains every layer's sub-model"):
                tiny_config(**doc)
            return
        cfg = tiny_config(**doc)
    else:
        needs = {"count_flops": False, **method_needs(algorithm)}
        cfg = tiny_config(algorithm=algorithm, schedule=schedule, **needs, **PFL)
    res = run_experiment(cfg)
    assert len(res.records) == 2
    pfl = res.summary["pfl"]
    assert 0.0 <= pfl["before_ft"]["mean"] <= 1.0 and 0.0 <= pfl["after_ft"]["mean"] <= 1.0
    assert torch.isfinite(res.weights).all()


def test_fedbabu_head_is_its_init_on_the_server_under_every_schedule():
    for schedule in ("vanilla", "anti"):
        exp_cfg = tiny_config(method=f"fedseq-{schedule}", rounds=3, **PFL)
        res = run_experiment(exp_cfg)
        exp = Experiment(exp_cfg)
        head = exp.space.unit_slices[exp.layout.head[0]]
        assert torch.equal(res.weights[head], exp.initial_weights()[head])


def test_fedrod_client_accuracy_beside_the_global_model_uses_the_generic_head():
    cfg = tiny_config(
        algorithm="fedrod",
        partition="dirichlet_classwise",
        pfl_test="matched",
        rounds=3,
        num_clients=6,
    )
    r = run_experiment(cfg).records[-1]
    exp = Experiment(cfg)
    assert sum(len(t) for t in exp.test_parts) == len(exp.dataset.test_y)  # tests cover it all
    assert r["acc_client_weighted"] == pytest.approx(r["test_acc"])


def test_measured_costs_travel_in_the_checkpoint():
    from fedbug.engine.simulation import Simulation

    cfg = tiny_config(system={"abilities": "uniform", "cost": "measured"})
    exp = Experiment(cfg)
    saved = Simulation(exp).state_dict()
    other = Experiment(cfg)  # measures again: other numbers
    Simulation(other).load_state_dict(saved)
    assert charged_times(other.system, 0, "rollback") == charged_times(exp.system, 0, "rollback")


def _spy_train_client(monkeypatch) -> list:
    """Record (task, runtime, result) of every train_client call fine-tuning makes."""
    import fedbug.engine.pfl

    seen = []
    real = fedbug.engine.pfl.train_client

    def spy(weights, task, data, state, runtime):
        result = real(weights, task, data, state, runtime)
        seen.append((task, runtime, result))
        return result

    monkeypatch.setattr(fedbug.engine.pfl, "train_client", spy)
    return seen


def test_finetuning_is_local_training_of_the_whole_fedbabu_model(monkeypatch):
    """REFERENCE.md: FedBABU fine-tunes the WHOLE model, the head it never trained in FL too;
    through train_client, in the run's memory format, on the fine-tuning round's generator."""
    from fedbug.engine.pfl import FINETUNE_ROUND

    cfg = tiny_config(
        algorithm="fedbabu", model="digits_cnn", num_clients=4, memory_format="channels_last", **PFL
    )
    exp = Experiment(cfg)
    seen = _spy_train_client(monkeypatch)
    settings = FinetuneSettings(epochs=1, lr=0.05, batch_size=8)
    exp.personal.finetune(exp.initial_weights(), lambda _i: {}, settings, seed=0)
    assert [task.client for task, _, _ in seen] == [0, 1, 2, 3]
    head = exp.space.unit_slices[exp.layout.head[0]]
    for task, runtime, result in seen:
        assert task.round == FINETUNE_ROUND
        assert all(result.trained)  # every unit, the head included
        assert result.delta[head].abs().sum() > 0
        x = runtime.prepare(exp.dataset.train_x[:2])
        assert x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)


def test_finetuning_honours_optimizer_momentum_and_clipping(monkeypatch):
    exp = Experiment(tiny_config(algorithm="fedper", num_clients=3, **PFL))
    weights = exp.initial_weights()
    seen = _spy_train_client(monkeypatch)

    def delta(**settings):
        seen.clear()
        ft = FinetuneSettings(epochs=1, lr=0.05, batch_size=8, **settings)
        exp.personal.finetune(weights, lambda _i: {}, ft, seed=0, clients=[0])
        return seen[0][2].delta

    steps = -(-len(exp.parts[0]) // 8)
    sgd = delta()
    clipped = delta(clip_grad_norm=1e-3)  # every step's gradient norm clipped to 1e-3
    assert float(clipped.norm()) <= steps * 0.05 * 1e-3 * (1 + 1e-4)
    assert float(sgd.norm()) > 10 * float(clipped.norm())
    assert not torch.allclose(delta(optimizer="adam"), sgd)
    assert not torch.equal(delta(momentum=0.9), sgd)
    assert torch.equal(delta(), sgd)  # the same seed, the same batches
