"""The simulated system counts a client's training FLOPs with its session's loss, as ``fedbug
cost`` does (audit a12): one helper, :mod:`fedbug.engine.counting`."""

import torch
from tiny import tiny_config

from fedbug.algorithms.base import ClientSession
from fedbug.algorithms.fedavg import FedAvg
from fedbug.engine import Experiment
from fedbug.engine.counting import counting_loss

SYSTEM = {"system": {"abilities": "uniform", "cost": "flops"}}


class GramLoss(ClientSession):
    """A session whose loss adds a counted matmul: sum(z z^T) over the batch's logits z (N, C)."""

    def loss(self, output, y):
        return super().loss(output, y) + (output @ output.T).sum()


def test_system_model_counts_the_sessions_loss(monkeypatch):
    cfg = tiny_config(**SYSTEM)
    plain = Experiment(cfg).system.per_sample
    monkeypatch.setattr(
        FedAvg, "start_client", lambda self, task, labels, *a: GramLoss(self, task, labels)
    )
    gram = Experiment(cfg).system.per_sample
    # on the 2-sample example, z (2, 10): forward z z^T 2*2*10*2 = 80 FLOPs, backward two
    # matmuls of as many (the gradient through each factor): 240 a batch, 120 a sample
    assert [g - p for g, p in zip(gram, plain)] == [120.0] * len(plain)


def test_a_session_only_a_round_starts_counts_the_algorithms_loss():
    exp = Experiment(tiny_config(algorithm="apf", **SYSTEM))
    loss = counting_loss(exp.cfg, exp.algorithm, torch.tensor([0, 1]), exp.mean_samples)
    assert loss == exp.algorithm.loss


def test_a_session_that_fails_outside_a_round_is_counted_with_the_algorithms_loss():
    """A user's session reading a payload it does not get here (KeyError) falls back as a
    built-in one that refuses with a ValueError does."""
    from types import SimpleNamespace

    def start_client(task, labels):
        return task.payload["c"]  # no payload outside a round

    algorithm = SimpleNamespace(start_client=start_client, loss="the algorithm's loss")
    cfg = tiny_config()
    assert counting_loss(cfg, algorithm, None, 10.0) == "the algorithm's loss"
