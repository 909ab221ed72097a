"""FedDecorr's term on the representation before the classifier; beta = 0 is FedAvg."""

import itertools

import torch
from tiny import tiny_config

from fedbug.algorithms.feddecorr import decorrelation_loss
from fedbug.engine import run_experiment


def test_loss_by_hand():
    z = torch.tensor([[1.0, 2.0, 0.0], [2.0, 1.0, 1.0], [0.0, 0.0, 5.0], [3.0, 1.0, 2.0]])
    n, d = z.shape
    cols = []
    for j in range(d):
        c = [z[i, j].item() for i in range(n)]
        mu = sum(c) / n
        var = sum((v - mu) ** 2 for v in c) / (n - 1)
        cols.append([(v - mu) / (var + 1e-8) ** 0.5 for v in c])
    total = 0.0
    for a, b in itertools.permutations(range(d), 2):
        k_ab = sum(cols[a][i] * cols[b][i] for i in range(n))
        total += k_ab**2
    expected = total / (d * (d - 1)) / n
    assert abs(decorrelation_loss(z).item() - expected) < 1e-5


def test_single_sample_gives_zero():
    assert decorrelation_loss(torch.randn(1, 4)).item() == 0.0


def test_term_reaches_the_model():
    a = run_experiment(tiny_config(algorithm="fedavg"))
    b = run_experiment(tiny_config(algorithm="feddecorr", feddecorr={"beta": 1.0}))
    assert not torch.equal(a.weights, b.weights)


def test_beta_zero_equals_fedavg_exactly():
    a = run_experiment(
        tiny_config(algorithm="fedavg", policy="top_down", top_down={"gu_ratio": 0.5})
    )
    b = run_experiment(
        tiny_config(
            algorithm="feddecorr",
            feddecorr={"beta": 0.0},
            policy="top_down",
            top_down={"gu_ratio": 0.5},
        )
    )
    assert torch.equal(a.weights, b.weights)


def test_representation_is_the_classifier_input_whatever_the_units():
    from fedbug.engine import Experiment

    exp = Experiment(
        tiny_config(algorithm="feddecorr", units=[["hidden.0"], ["hidden.1", "classifier"]])
    )
    rt = exp.make_runtime()
    rt.model(exp.dataset.prepare(exp.dataset.train_x[:5]))
    assert rt._features.shape == (5, 32)  # MLP hidden (64, 32): the classifier's input
