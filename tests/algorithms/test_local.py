"""Local-only training: each client's model is its own, the server's never moves."""

import pytest
import torch
from tiny import tiny_config, without_timing

from fedbug.engine import Experiment, run_experiment
from fedbug.errors import ConfigError


def test_one_client_trains_exactly_as_fedavg_with_one_client():
    """With a single client, FedAvg's global model is that client's model round after round, so
    local-only training must give the same numbers."""
    kw = dict(evaluation="personalized", rounds=3, num_clients=1, clients_per_round=1)
    local = run_experiment(tiny_config(algorithm="local", **kw))
    fedavg = run_experiment(tiny_config(algorithm="fedavg", **kw))
    strip = lambda recs: [{k: r[k] for k in ("test_acc", "train_loss")} for r in recs]  # noqa: E731
    assert strip(local.records) == strip(fedavg.records)


def test_nothing_travels_and_the_server_model_never_moves():
    cfg = tiny_config(algorithm="local", evaluation="personalized", rounds=3)
    initial = Experiment(cfg).initial_weights().clone()
    res = run_experiment(cfg)
    assert torch.equal(res.weights, initial)
    assert all(r["bytes_up"] == 0 and r["bytes_down"] == 0 for r in res.records)
    assert res.records[-1]["test_acc"] > res.records[0]["test_acc"]  # the clients did learn
    assert without_timing(res.records) == without_timing(run_experiment(cfg).records)


def test_global_evaluation_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="use evaluation: personalized"):
        run_experiment(tiny_config(algorithm="local"))


def test_method_local_sets_personalized_evaluation():
    cfg = tiny_config(method="local")
    assert (cfg.algorithm, cfg.evaluation) == ("local", "personalized")
