"""A round's record (fedbug.engine.record): the figures it gives over the round's results."""

from __future__ import annotations

import torch

from fedbug.core.protocol import ClientResult
from fedbug.engine.record import RoundRecord


def record(losses: list[float | None]) -> dict:
    results = [
        ClientResult(k, 5, torch.zeros(3), [True], {}, train_loss=loss)
        for k, loss in enumerate(losses)
    ]
    return RoundRecord(
        round=1,
        evaluated={},
        results=results,
        lr=0.1,
        bytes_down=12,
        trained_sublayers=[1],
        client_drift=0.0,
        server={},
        simulated={},
        time_train=0.0,
        time_eval=0.0,
        wall_time=0.0,
        dropped=[],
        aggregated=True,
    ).to_dict()


def test_train_loss_is_the_mean_over_the_clients_that_reported_one():
    # a result may carry no loss (ClientResult's default; check_update lets it through): the
    # record averaged None into the sum and failed with a TypeError
    assert record([0.5, 1.5])["train_loss"] == 1.0
    with_none = record([0.5, None, 1.5])
    assert with_none["train_loss"] == 1.0 and with_none["num_clients"] == 3
    assert record([None, None])["train_loss"] is None
    assert record([])["train_loss"] is None
