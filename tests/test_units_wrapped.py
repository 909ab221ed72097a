"""A wrapped model's units: the engine (:func:`fedbug.engine.build.build_parts`) and
``find_units`` on the wrapper alone (its ``fedbug_units()``) cut it the same way, for a model
that is traced, one that declares its units and one whose units the config lists, because
both rename the model's unit names through one renamer (:func:`fedbug.core.units.unit_renamer`)."""

import pytest
import torch
from torch import nn

from fedbug.algorithms import build_algorithm
from fedbug.config import load_config
from fedbug.core.units import find_units
from fedbug.engine.build import build_parts
from fedbug.errors import ConfigError

WRAPPERS = ["fedrod", "fjord", "heterofl", "fedrolex", "slt"]
OPTIONS = {"slt": {"slt": {"constraint": 0.75}}}  # the default 0.5 fits no configuration here
UNITS = [["fc1", "fc2"], "fc3"]  # fc1 and fc2 one unit: tracing would make them two


class MLP(nn.Module):
    """4 -> 6 -> 6 -> 3, ReLU between."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class Declares(MLP):
    listed: list = UNITS

    def fedbug_units(self) -> list:
        return self.listed


def _algorithm(name: str, **cfg):
    doc = {"dataset": "digits", "model": "mlp", "algorithm": name, "system": {}, **cfg}
    doc.update(OPTIONS.get(name, {}))
    c = load_config(None, doc=doc)
    return c, build_algorithm(name, c.global_lr, {name: c.options(name)})


def _parts(algorithm: str, model: nn.Module, **cfg):
    return build_parts(*_algorithm(algorithm, **cfg), model, torch.zeros(2, 4))


@pytest.mark.parametrize("algorithm", WRAPPERS)
def test_traced_model_the_engine_and_the_wrapper_agree(algorithm):
    parts = _parts(algorithm, MLP())
    assert parts.units == find_units(parts.template, torch.zeros(2, 4))
    assert [u.modules for u in parts.units][:3] == [("model.fc1",), ("model.fc2",), ("model.fc3",)]


@pytest.mark.parametrize("algorithm", WRAPPERS)
def test_declared_units_the_engine_and_the_wrapper_agree(algorithm):
    parts = _parts(algorithm, Declares())
    assert parts.units == find_units(parts.template)  # no example: the declared list only
    assert [u.modules for u in parts.units][:2] == [("model.fc1", "model.fc2"), ("model.fc3",)]


@pytest.mark.parametrize("algorithm", WRAPPERS)
def test_units_in_the_config_are_those_the_model_would_declare(algorithm):
    listed = _parts(algorithm, MLP(), units=UNITS)
    declared = _parts(algorithm, Declares())
    assert listed.units == declared.units == find_units(declared.template)


@pytest.mark.parametrize("algorithm", ["fedrod", "fjord", "heterofl"])
def test_a_bad_declared_unit_is_refused_alike(algorithm):
    """A declared name that is not a submodule: the engine and find_units on the wrapper name
    it as the model declared it (they used to differ: the wrappers prefixed ``model.``)."""
    model = Declares()
    model.listed = ["fc1", "nope", "fc3"]
    with pytest.raises(ConfigError) as engine:
        _parts(algorithm, model)
    wrapped = _algorithm(algorithm)[1].wrap_model(model, "fc3")
    with pytest.raises(ConfigError) as alone:
        find_units(wrapped)
    assert str(alone.value) == str(engine.value)
    assert str(engine.value).startswith("unit 'nope' is not a submodule of ")
