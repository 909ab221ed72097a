"""One builder of each thing (review a11, a14): a client's round config from
``engine.client_task.client_task`` (the round loop, the attack, ``fedbug cost``, fine-tuning),
its training settings from ``experiment.train_settings`` (the attack's with the recorded momentum
and weight decay; fine-tuning's with its own fields), and the attacked model built as the run
built it (the algorithm's wrap included)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny import tiny_config

from fedbug.engine.client_task import client_task, lr_at
from fedbug.engine.experiment import train_settings
from fedbug.errors import ConfigError


def test_the_rate_decays_a_round_after_the_first():
    cfg = tiny_config(lr=0.1, lr_decay=0.5, rounds=3)
    assert [lr_at(cfg, r) for r in (1, 2, 3)] == [0.1, 0.05, 0.025]
    task = client_task(cfg, 3, 4, 336.5, extra={"width": 0.25})
    assert (task.round, task.client, task.seed, task.rounds) == (3, 4, cfg.seed, 3)
    assert task.lr == 0.025 and task.mean_samples == 336.5 and task.extra == {"width": 0.25}
    assert client_task(cfg, 3, 4, 10, lr=0.5, seed=7).lr == 0.5


@pytest.mark.slow
def test_the_round_loop_sends_the_builders_tasks(monkeypatch):
    """Under lr_decay and HeteroFL's per-client width: each task the loop sends is the
    builder's of (round, client, the run's mean size, the payload, the client's config)."""
    from fedbug.engine import rounds
    from fedbug.engine.rounds import run_experiment

    sent, means = [], []
    real = rounds.RoundLoop.client_tasks

    def spy(loop, r):
        sent.append(real(loop, r))
        means.append(loop.exp.mean_samples)
        return sent[-1]

    monkeypatch.setattr(rounds.RoundLoop, "client_tasks", spy)
    cfg = tiny_config(lr=0.1, lr_decay=0.5, algorithm="heterofl", local_steps=1, threads=1)
    run_experiment(cfg, None)
    for r, tasks in enumerate(sent, 1):
        for t in tasks:
            want = client_task(cfg, r, t.client, means[0], extra=t.extra)
            assert t == dataclasses.replace(want, payload=t.payload)
    assert [t.lr for t in sent[1]] == [0.05] * 3 and all("width" in t.extra for t in sent[1])


def test_the_attacks_settings_are_the_runs_with_the_recorded_optimiser_values():
    """Before, the attack's TrainSettings held only epochs, steps and batch size: the rest were
    TrainSettings' defaults (sgd, momentum 0, weight decay 1e-3, no clipping), not the run's."""
    from fedbug.attack.unroll import settings_of

    cfg = tiny_config(optimizer="adam", momentum=0.9, weight_decay=0.01, clip_grad_norm=2.0)
    assert settings_of(cfg) == train_settings(cfg)
    got = settings_of(cfg, {"momentum": 0.5, "weight_decay": 0.0})
    assert got == dataclasses.replace(train_settings(cfg), momentum=0.5, weight_decay=0.0)


def test_fine_tunings_settings_are_the_runs_with_its_own_fields():
    from fedbug.engine.pfl import FinetuneSettings

    run = train_settings(tiny_config(upload="full", local_steps=7))
    ft = FinetuneSettings(epochs=2, lr=0.3, momentum=0.5, batch_size=8).train_settings(run)
    assert (ft.local_epochs, ft.local_steps, ft.batch_size, ft.momentum) == (2, None, 8, 0.5)
    assert ft.upload == "full" and ft.count_flops is False and ft.dp_sgd is None


def _recorded(tmp_path, **overrides):
    from fedbug.engine.rounds import run_experiment
    from fedbug.results.updates import load_update, recorded

    cfg = tiny_config(rounds=1, clients_per_round=1, local_steps=1, record_updates=[1], **overrides)
    run_experiment(cfg, tmp_path / "run")
    folder = tmp_path / "run"
    return folder, load_update(folder, 1, recorded(folder)[1][0])


def test_the_attacked_model_of_a_wrapped_run_is_the_runs_model(tmp_path):
    """HeteroFL wraps the model (its parameters under ``model.``): the attack built the bare
    model from the recorded name and refused the update ("does not fit model 'mlp'")."""
    from fedbug.attack.driver import build_attacked_model, run_config

    folder, up = _recorded(tmp_path, algorithm="heterofl")
    model = build_attacked_model(up, run_config(folder))
    state = model.state_dict()
    assert any(k.startswith("model.") for k in state)
    for name, (off, n) in up.meta["received_names"].items():
        assert torch.equal(state[name].flatten(), up.received[off : off + n].to(state[name].dtype))


def test_a_recorded_update_naming_another_model_is_one_line(tmp_path):
    from fedbug.attack.driver import build_attacked_model, run_config

    folder, up = _recorded(tmp_path)
    up.meta["model"] = "digits_cnn"
    with pytest.raises(ConfigError, match="names model 'digits_cnn' and config.yaml 'mlp'"):
        build_attacked_model(up, run_config(folder))
