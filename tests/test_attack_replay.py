"""What the attack cannot replay exactly (issue 32, item 1): each case refused in one line (exit
2 from ``fedbug attack``), warned, or modelled (BatchNorm), and the one-step replay check that
downgrades a refusal where the recorded inputs give the update exactly."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedbug.attack import Observation
from fedbug.attack.replay import (
    algorithm_findings,
    attack_mode,
    clipped_findings,
    config_findings,
    replay_error,
)
from fedbug.cli import main

pytest.importorskip("skimage")


def cfg(**kw):
    base = {"augment": "none", "optimizer": "sgd", "dp": None, "dp_sgd": None,
            "clip_grad_norm": None}  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def kinds(found):
    return [(f.kind, f.key) for f in found]


# -- the rules, one by one ------------------------------------------------------------------------
def test_a_plain_one_step_sgd_update_raises_nothing():
    assert config_findings(cfg(), {"steps": 1}, "dlg", False) == []
    assert algorithm_findings(SimpleNamespace(algorithm="fedavg")) == []
    assert algorithm_findings(SimpleNamespace(algorithm="fedbabu")) == []  # FedSeq's


@pytest.mark.parametrize(
    "kw, key, words",
    [
        ({"augment": "crop_flip"}, "augment", "augment: none"),
        ({"optimizer": "adam"}, "optimizer", "optimizer: sgd"),
    ],
)
def test_config_refusals_name_the_key_and_the_fix(kw, key, words):
    (f,) = config_findings(cfg(**kw), {"steps": 1}, "dlg", False)
    assert (f.kind, f.key) == ("refuse", key) and words in str(f)
    assert "\n" not in str(f)


def test_single_step_dlg_on_a_multi_step_update_is_refused_and_ig_is_warned():
    (f,) = config_findings(cfg(), {"steps": 5}, "dlg", False)
    assert (f.kind, f.key) == ("refuse", "--method dlg") and "--method ig" in f.line
    (w,) = config_findings(cfg(), {"steps": 5}, "ig", False)
    assert (w.kind, w.key) == ("warn", "local_steps") and "lower bound" in w.line


def test_a_client_update_under_dp_is_warned_and_the_release_is_not():
    dp = SimpleNamespace(clip=1.0)
    assert kinds(config_findings(cfg(dp=dp), {"steps": 1}, "dlg", False)) == [("warn", "dp")]
    assert config_findings(cfg(dp=dp), {"steps": 1}, "dlg", True) == []


def test_an_update_under_dp_sgd_is_warned_as_what_the_attack_measures():
    found = config_findings(cfg(dp_sgd=SimpleNamespace(clip=1.0)), {"steps": 1}, "dlg", False)
    assert kinds(found) == [("warn", "dp_sgd")] and "DP-SGD" in found[0].line


def test_an_augmentation_the_record_does_not_name_is_warned():
    assert kinds(config_findings(cfg(augment="auto"), {"steps": 1}, "dlg", False)) == [
        ("warn", "augment")
    ]
    assert config_findings(cfg(augment="auto"), {"steps": 1, "augment": "none"}, "dlg", False) == []


@pytest.mark.parametrize(
    "name, want",
    [
        ("fedprox", [("refuse", "algorithm")]),  # adjust_grads
        ("feddyn", [("refuse", "algorithm")]),
        ("scaffold", [("refuse", "algorithm")]),
        ("feddecorr", [("refuse", "algorithm")]),  # extra_loss
        ("fjord", [("refuse", "algorithm")]),  # wrap_model: a sub-model
        ("apf", [("warn", "algorithm")]),  # start_client
        ("fedper", [("warn", "algorithm")]),  # local_units
    ],
)
def test_algorithms_are_judged_by_their_hooks(name, want):
    assert kinds(algorithm_findings(SimpleNamespace(algorithm=name))) == want


def one_step(model: nn.Module, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    names = [k for k, _ in model.named_parameters()]
    return dict(zip(names, torch.autograd.grad(loss, list(model.parameters()))))


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)
    )


def test_batchnorm_is_modelled_with_batch_statistics_as_the_client_trained():
    """The client's step ran BatchNorm in training mode (batch statistics): the attack's model
    in that mode gives the recorded gradient exactly; in evaluation mode (running statistics,
    here the initial 0 and 1) it misses it."""
    model, gen = bn_model(), torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 1, 2, 2, generator=gen), torch.tensor([0, 1, 2, 1])
    model.train()
    target = one_step(model, x, y)
    model.eval()
    obs = Observation(model, target, (1, 2, 2), 4, 3)
    assert replay_error(obs, x, y) > 0.1
    assert attack_mode(model) == []
    assert model[2].training and not model.training
    assert replay_error(obs, x, y) < 1e-6


def test_dropout_is_refused():
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5), nn.Linear(6, 3))
    (f,) = attack_mode(model)
    assert (f.kind, f.key) == ("refuse", "model") and "p=0.5" in f.line
    assert attack_mode(nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.0))) == []


def test_dlg_on_a_clipped_step_is_refused_and_on_an_unclipped_one_not():
    """The observed gradient's norm is 5 (3-4-5); at a clip of 5 the step was scaled to it."""
    obs = Observation(nn.Linear(2, 1), {"weight": torch.tensor([[3.0, 4.0]])}, (2,), 1, 1)
    (f,) = clipped_findings(cfg(clip_grad_norm=5.0), obs, "dlg", 1)
    assert (f.kind, f.key) == ("refuse", "clip_grad_norm") and "--method ig" in f.line
    assert clipped_findings(cfg(clip_grad_norm=6.0), obs, "dlg", 1) == []
    assert clipped_findings(cfg(clip_grad_norm=5.0), obs, "ig", 1) == []


# -- through fedbug attack ------------------------------------------------------------------------
def tiny_run(tmp_path, *extra: str):
    from fedbug.api import run
    from fedbug.config import load_config

    sets = ["dataset=digits", "model=mlp", "num_clients=4", "clients_per_round=1", "rounds=2"]
    sets += ["local_steps=1", "batch_size=2", "count_flops=false", "threads=1", *extra]
    return run(load_config(None, sets), tmp_path / "run").run_dir


@pytest.fixture
def plots(stub_plot):
    stub_plot("plot_run", lambda records, path, title: path.write_bytes(b"\x89PNG\r\n\x1a\n"))


def attack(folder, capsys, *args):
    rc = main(["attack", str(folder), "--iterations", "1", "--json", *args])
    out = capsys.readouterr()
    return rc, out


@pytest.mark.slow  # the first attack to score imports scikit-image, SciPy, matplotlib: seconds
def test_fedbug_attack_refuses_augmentation_in_one_line_and_allows_it_when_asked(
    tmp_path, plots, capsys
):
    folder = tiny_run(tmp_path, "augment=flip", "record_updates=[1]")
    rc, out = attack(folder, capsys, "--method", "dlg")
    assert rc == 2 and len(out.err.strip().splitlines()) == 1
    assert "augment: flip draws a transform" in out.err and "augment: none" in out.err
    rc, out = attack(folder, capsys, "--method", "dlg", "--allow-inexact")
    assert rc == 0
    assert any("augment: flip" in line for line in json.loads(out.out)["inexact"])


@pytest.mark.slow  # as above
def test_fedprox_one_step_replays_exactly_and_is_only_warned(tmp_path, plots, capsys):
    """FedProx's term mu (w - w_t) is zero at the received weights: its one-step update is
    the task's gradient, which the replay check measures (error 0 to float rounding)."""
    folder = tiny_run(tmp_path, "algorithm=fedprox", "record_updates=[1]")
    rc, out = attack(folder, capsys, "--method", "dlg")
    assert rc == 0
    s = json.loads(out.out)
    assert s["replay_error"] < 1e-4
    assert any(x.startswith("warn: algorithm: fedprox") for x in s["inexact"])
    assert "fedbug attack: warn: algorithm: fedprox" in out.err


def test_a_multi_step_update_attacked_with_dlg_is_refused(tmp_path, plots, capsys):
    folder = tiny_run(tmp_path, "local_steps=3", "record_updates=[1]")
    rc, out = attack(folder, capsys, "--method", "dlg")
    assert rc == 2 and "--method dlg: matches one step's gradient" in out.err


def test_released_needs_the_next_round_recorded(tmp_path, plots, capsys):
    folder = tiny_run(tmp_path, "record_updates=[2]")
    rc, out = attack(folder, capsys, "--released")
    assert rc == 2 and "record_updates: [2, 3]" in out.err


@pytest.mark.slow  # two DP runs and two attacks: seconds
def test_the_released_update_under_dp_carries_the_servers_noise(tmp_path, plots, capsys):
    """One client per round, clip 100 (never reached): without noise the released update is
    the client's own (replay error ~0); with noise multiplier 1 (std 100 per entry) it is
    noise (relative error ~1: the client's gradient is lost in it), and the client's update is
    warned as the trusted server's view."""
    dp = "dp={clip: 100.0, noise_multiplier: %s}"
    sets = ("weighting=uniform", "record_updates=[1, 2]")
    quiet = tiny_run(tmp_path / "a", dp % 0.0, *sets)
    rc, out = attack(quiet, capsys, "--released", "--round", "1", "--method", "dlg")
    assert rc == 0 and json.loads(out.out)["replay_error"] < 1e-3
    loud = tiny_run(tmp_path / "b", dp % 1.0, *sets)
    rc, out = attack(loud, capsys, "--released", "--round", "1", "--method", "dlg")
    s = json.loads(out.out)
    assert rc == 0 and s["replay_error"] > 0.99 and s["client"] == "released"
    rc, out = attack(loud, capsys, "--round", "1", "--method", "dlg")
    assert rc == 0 and any(x.startswith("warn: dp:") for x in json.loads(out.out)["inexact"])
