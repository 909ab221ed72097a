"""One builder of what a run trains (:mod:`fedbug.engine.build`): the engine and ``fedbug cost``
cut a config's model into the same units, and unit names a config lists name the model's own
submodules wherever an algorithm wraps it (FedROD's ``units:`` failed in a run while ``fedbug
cost`` accepted it)."""

from __future__ import annotations

import pytest
from tiny import tiny_config

import fedbug
from fedbug.engine import Experiment
from fedbug.errors import ConfigError
from fedbug.report.cost import cost_report

UNITS = ["conv1", "conv2", "fc1", "fc2", "fc3"]  # digits_cnn's layers, listed by name


def _pfl(**kw):
    return tiny_config(
        model="digits_cnn", evaluation="personalized", finetune_epochs=0, rounds=1, **kw
    )


def test_fedrod_with_listed_units_runs():
    cfg = _pfl(algorithm="fedrod", units=UNITS)
    exp = Experiment(cfg)
    names = [u.name for u in exp.units]
    assert names[:5] == [f"model.{n}" for n in UNITS] and len(names) == 6  # + its personal head
    assert exp.layout.extra == (5,)
    assert fedbug.run(cfg).summary["status"] == "completed"


def test_the_engine_and_cost_build_the_same_units():
    for algorithm in ("fedavg", "fedrod", "fedbabu"):
        cfg = _pfl(algorithm=algorithm, units=UNITS, head_units=1)
        built = Experiment(cfg)
        report = cost_report(cfg)
        names = [u.name for u in built.units]
        if algorithm == "fedavg":
            assert report["setting"]["units"] == names
        for phase in report["methods"][algorithm]["phases"]:
            assert set(phase["units"]) <= set(names)


def test_sublayers_name_the_models_own_submodules_under_a_wrapper():
    cfg = _pfl(algorithm="fedrod", units=UNITS, sublayers=[["conv1", "conv2"], ["fc1", "fc2"]])
    exp = Experiment(cfg)
    assert exp.layout.sublayers == ((0, 1), (2, 3))


@pytest.mark.parametrize("task", ["regression", "multilabel"])
def test_personalized_evaluation_of_a_task_it_cannot_score_is_refused(task):
    with pytest.raises(ConfigError, match="personalized"):
        Experiment(tiny_config(evaluation="personalized", task=task, dataset="synthetic"))
