"""The optimiser table (fedbug.core.optimizers): one entry for each name the config allows,
each entry's state copies what its torch optimiser keeps, the sequential and cohort executors
agreeing under each, and an unknown name one ValueError everywhere (was: a silent SGD)."""

from __future__ import annotations

import typing

import pytest
import torch
from test_cohort import UNEQUAL_EPOCH, assert_close_to_sequential, pair_config
from tiny import TwoLayer, runtime

from fedbug.config.schema import BaseConfig
from fedbug.core.flops import optimizer_state_copies
from fedbug.core.optimizers import OPTIMIZERS, optimizer_entry
from fedbug.core.protocol import TrainSettings

NAMES = typing.get_args(BaseConfig.model_fields["optimizer"].annotation)


def test_every_name_the_config_allows_has_one_entry_and_no_other():
    assert NAMES and set(NAMES) == set(OPTIMIZERS)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_state_copies_are_what_the_torch_optimizer_keeps(name, momentum):
    """After one step, the optimiser's state tensors the size of the parameter (Adam's step
    counter is left out) number the entry's copies."""
    p = torch.nn.Parameter(torch.ones(3))
    settings = TrainSettings(optimizer=name, momentum=momentum, weight_decay=0.0)
    opt = optimizer_entry(name).make([p], 0.1, settings)
    p.grad = torch.ones(3)
    opt.step()
    kept = [v for v in opt.state[p].values() if torch.is_tensor(v) and v.shape == p.shape]
    assert len(kept) == optimizer_state_copies(name, momentum)


@pytest.mark.parametrize("name", NAMES)
def test_the_cohort_executor_gives_the_sequential_numbers_under_each(name):
    """The harness of tests/test_cohort.py (each unit within 1e-4 of its change), on the
    config its Adam test takes (one thread; unequal clients of one epoch)."""
    over = {"lr": 0.01} if name == "adam" else {"momentum": 0.9}
    cfg = pair_config("fedavg", "none", optimizer=name, **UNEQUAL_EPOCH, **over)
    assert_close_to_sequential(cfg)


def test_an_unknown_name_is_one_value_error_everywhere():
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop': one of sgd, adam"):
        optimizer_state_copies("rmsprop", 0.0)
    rt = runtime(TwoLayer(), settings=TrainSettings(optimizer="rmsprop", count_flops=False))
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        rt.make_optimizer(0.1)  # the client's optimiser
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        optimizer_entry("rmsprop")  # the cohort executor's stacked step is asked of it
