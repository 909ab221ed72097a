"""Personalized evaluation scores each client through the task's test sums (audit a13): a task's
definition of accuracy is in one place, ``Task.batch_sums``, for the global and the clients'
models alike."""

import torch
from tiny import tiny_config

from fedbug.core.tasks import Classification
from fedbug.engine import Experiment
from fedbug.engine.states import ClientStates

PFL = {"evaluation": "personalized", "partition": "dirichlet_classwise"}


class TopTwo(Classification):
    """Classification whose ``correct`` counts a sample whose label is among the two best."""

    def batch_sums(self, output, y):
        sums = super().batch_sums(output, y)
        sums["correct"] = (output.topk(2, dim=1).indices == y[:, None]).any(1).sum()
        return sums


def test_client_accuracy_is_the_tasks_batch_sums_on_its_split():
    exp = Experiment(tiny_config(algorithm="fedper", num_clients=5, **PFL), task=TopTwo())
    weights = exp.initial_weights()
    scores = exp.personal.evaluate(weights, ClientStates(exp.algorithm, exp.space).get)
    model, ds = exp.personal.model, exp.dataset  # every client's model: the initial one
    top1, top2 = [], []
    with torch.no_grad():
        for s in scores:
            idx = exp.test_parts[s.client]
            out, y = model(ds.prepare(ds.test_x[idx])), ds.test_y[idx]
            top1.append(int((out.argmax(1) == y).sum()))
            top2.append(int((out.topk(2, dim=1).indices == y[:, None]).any(1).sum()))
    assert top2 != top1  # the test tells the task's count from argmax's
    assert [s.correct for s in scores] == top2
