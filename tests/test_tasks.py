"""Tasks: each built-in's loss and metrics worked by hand; a regression model with a user loss
trains through ``fedbug.run`` under FedAvg, FedProx, FedDyn and SCAFFOLD with bottom-up
freezing; the quadratic two-client problem runs through the public API with a user loss and
reaches its closed-form fixed points; tasks an algorithm cannot serve are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import fedbug
from fedbug.core.tasks import Classification, CustomTask, MultiLabel, NextToken, Regression
from fedbug.errors import ConfigError


def _sums(task, output, y):
    return task.finish(task.batch_sums(output, y), len(y))


def test_classification_by_hand():
    out = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    y = torch.tensor([0, 1, 1])
    got = _sums(Classification(), out, y)
    assert got["acc"] == pytest.approx(2 / 3)
    ce = [math.log(1 + math.exp(-2)), math.log(1 + math.exp(-1)), math.log(1 + math.exp(3))]
    assert got["loss"] == pytest.approx(sum(ce) / 3, rel=1e-6)


def test_regression_by_hand():
    out = torch.tensor([[1.0], [2.0], [4.0]])
    y = torch.tensor([[1.0], [3.0], [5.0]])  # errors 0, -1, -1; mean y = 3, SST = 4 + 0 + 4
    got = _sums(Regression(), out, y)
    assert got["mse"] == pytest.approx(2 / 3)
    assert got["mae"] == pytest.approx(2 / 3)
    assert got["r2"] == pytest.approx(1 - 2 / 8)
    assert Regression().loss(out, y).item() == pytest.approx(2 / 3)


def test_multilabel_by_hand():
    out = torch.tensor([[1.0, -1.0, 2.0], [-1.0, 1.0, -2.0]])
    y = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # TP 2, FP 1, FN 0; one exact row
    got = _sums(MultiLabel(), out, y)
    assert got["micro_f1"] == pytest.approx(4 / 5)
    assert got["subset_acc"] == pytest.approx(1 / 2)


def test_next_token_perplexity_is_exp_of_the_mean_loss():
    out = torch.zeros(2, 3, 4)  # uniform over 4 tokens: loss log 4, perplexity 4
    y = torch.tensor([[0, 1, 2], [3, 0, 1]])
    got = _sums(NextToken(), out, y)
    assert got["perplexity"] == pytest.approx(4.0)
    assert got["loss"] == pytest.approx(math.log(4))


# -- through the public API ---------------------------------------------------------------


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 16), nn.Tanh())
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.body(x))


def _regression_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    w = np.array([[1.5], [-2.0], [0.5]])
    x = rng.normal(size=(240, 3)).astype(np.float32)
    y = (x @ w + 0.05 * rng.normal(size=(240, 1))).astype(np.float32)
    xt = rng.normal(size=(80, 3)).astype(np.float32)
    yt = (xt @ w).astype(np.float32)
    return fedbug.FederatedDataset(
        "linear", x, y, xt, yt, num_classes=1, scale=1.0, labels="values", inputs="vector"
    )


def _mse(output, y):
    return ((output - y) ** 2).mean()


def _config(**values):
    """A config of a few clients, every one taking part, on one thread, FLOPs not counted."""
    base = {"num_clients": 2, "clients_per_round": 2, "count_flops": False, "threads": 1}
    return fedbug.config(**{**base, **values})


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "feddyn", "scaffold"])
def test_regression_with_a_user_loss_trains_under_bottom_up(algorithm):
    cfg = _config(
        algorithm=algorithm,
        policy="bottom_up",
        bottom_up={"gu_ratio": 0.5},
        partition="iid",
        num_clients=4,
        rounds=6,
        local_steps=10,
        batch_size=20,
        lr=0.05,
        weight_decay=0.0,
    )
    res = fedbug.run(cfg, model=Net, dataset=_regression_data(), loss=_mse)
    losses = [r["test_loss"] for r in res.records]
    assert losses[-1] < 0.5 * losses[0]
    assert "test_acc" not in res.records[-1]
    assert res.summary["metric"] == "loss" and res.summary["final"] == losses[-1]
    assert res.summary["task"]["loss"].endswith("_mse")


def test_built_in_regression_task_reports_r2_mae():
    cfg = _config(
        task="regression",
        partition="iid",
        num_clients=4,
        rounds=5,
        local_steps=10,
        batch_size=20,
        lr=0.05,
        weight_decay=0.0,
    )
    res = fedbug.run(cfg, model=Net, dataset=_regression_data())
    last = res.records[-1]
    assert {"test_mse", "test_mae", "test_r2", "test_loss"} <= set(last)
    assert last["test_r2"] > 0.5
    assert res.summary["metric"] == "r2" and res.summary["best"] >= last["test_r2"]


def test_quadratic_two_clients_through_the_public_api():
    """f_i(w) = 0.5 s_i^2 (w - b_i)^2 (see tests/algorithms/test_scaffold.py): FedAvg's fixed
    point and SCAFFOLD's global optimum, closed form, with a user loss and no subclassing."""
    s, b = (1.0, 2.0), (1.0, -1.0)
    x = [np.full((4, 1), si, np.float32) for si in s]
    y = [np.full((4,), si * bi, np.float32) for si, bi in zip(s, b)]
    data = fedbug.FederatedDataset.from_clients(
        "quadratic",
        list(zip(x, y)),
        test=(np.ones((2, 1), np.float32), np.zeros(2, np.float32)),
        num_classes=1,
        labels="values",
        scale=1.0,
        inputs="vector",
    )

    class Scalar(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(1, 1, bias=False)
            nn.init.zeros_(self.w.weight)

        def forward(self, x):
            return self.w(x).squeeze(-1)

    def half_mse(output, y):
        return 0.5 * ((output - y) ** 2).mean()

    def run(algorithm):
        cfg = _config(
            algorithm=algorithm,
            partition="natural",
            rounds=200,
            local_steps=5,
            batch_size=4,
            lr=0.1,
            weight_decay=0.0,
            weighting="uniform",
            eval_every=200,
        )
        return float(fedbug.run(cfg, model=Scalar, dataset=data, loss=half_mse).weights[0])

    q = [(1 - 0.1 * si * si) ** 5 for si in s]
    fedavg_fixed = sum(bi * (1 - qi) for bi, qi in zip(b, q)) / sum(1 - qi for qi in q)
    optimum = sum(si * si * bi for si, bi in zip(s, b)) / sum(si * si for si in s)
    assert run("fedavg") == pytest.approx(fedavg_fixed, abs=1e-5)
    assert run("scaffold") == pytest.approx(optimum, abs=1e-5)


def test_fedrod_refuses_a_task_it_cannot_serve():
    with pytest.raises(ConfigError, match="fedrod.*classification"):
        fedbug.config(algorithm="fedrod", task="regression", evaluation="personalized")


def test_a_custom_task_object_is_recorded():
    task = CustomTask(_mse, metrics={"abs": lambda o, y: (o - y).abs().sum()})
    cfg = _config(
        partition="iid",
        rounds=1,
        local_steps=1,
        batch_size=20,
    )
    res = fedbug.run(cfg, model=Net, dataset=_regression_data(), task=task)
    assert "test_abs" in res.records[-1]
    assert res.summary["task"]["metrics"] == ["abs"]


# -- models of any size -------------------------------------------------------------------


def _blobs():
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 4, generator=g) * 3
    y = torch.arange(120) % 3
    x = centers[y] + torch.randn(120, 4, generator=g)
    return fedbug.FederatedDataset("blobs", x, y, x[:30], y[:30], num_classes=3, scale=1.0)


@pytest.mark.parametrize(
    ("algorithm", "policy"),
    [
        ("fedavg", "none"),
        ("fedprox", "bottom_up"),
        ("feddyn", "top_down"),
        ("fedexp", "none"),
        ("scaffold", "bottom_up"),
        ("feddecorr", "none"),
    ],
)
def test_a_one_unit_model_runs_under_every_non_personalized_method(algorithm, policy):
    cfg = _config(
        algorithm=algorithm,
        policy=policy,
        partition="iid",
        num_clients=3,
        rounds=2,
        local_steps=3,
        batch_size=10,
    )
    res = fedbug.run(cfg, model=lambda: nn.Linear(4, 3), dataset=_blobs())
    assert res.summary["num_units"] == 1 and res.records[-1]["test_acc"] is not None


@pytest.mark.parametrize("algorithm", ["fedper", "fedrep", "fedbabu", "lg_fedavg"])
def test_personalized_methods_refuse_a_one_unit_model_with_a_reason(algorithm):
    cfg = _config(
        algorithm=algorithm,
        evaluation="personalized",
        partition="iid",
        num_clients=3,
        rounds=1,
        local_steps=1,
    )
    with pytest.raises(ConfigError, match=f"{algorithm} keeps a head of 1 unit.*has 1 unit"):
        fedbug.run(cfg, model=lambda: nn.Linear(4, 3), dataset=_blobs())


def test_a_user_model_and_data_are_recorded_as_such():
    cfg = _config(
        partition="iid",
        rounds=1,
        local_steps=1,
    )
    res = fedbug.run(cfg, model=Net, dataset=_regression_data(), loss=_mse)
    s = res.summary
    assert s["config"]["dataset"] == "user:linear"
    assert s["config"]["model"] == f"user:{Net.__module__}.Net"
    assert s["model_class"] == f"{Net.__module__}.Net"
    assert s["data"] == {
        "name": "linear",
        "train": [240, 3],
        "test": [80, 3],
        "num_classes": 1,
        "labels": "values",
    }
    assert s["task"]["name"] == "custom"


def test_api_errors_speak_api_and_cli_errors_speak_cli(tmp_path, capsys):
    from fedbug.cli import main

    cfg = _config(
        dataset="digits",
        model="mlp",
        rounds=1,
        local_steps=1,
        batch_size=16,
    )
    fedbug.run(cfg, run_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"resume=True.*run_dir") as exc:
        fedbug.run(cfg, run_dir=tmp_path / "run")
    assert "--" not in str(exc.value)
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: mlp\nnum_clients: 2\nclients_per_round: 2\nrounds: 1\n"
        "local_steps: 1\ncount_flops: false\nthreads: 1\n"
    )
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "-q"]) == 0
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--out" in err and "resume=True" not in err
