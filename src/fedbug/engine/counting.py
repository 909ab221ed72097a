"""The client session the cost counts take their loss from: the simulated system's per-sample
FLOPs and times (:class:`~fedbug.engine.experiment.Experiment`,
:func:`~fedbug.system.per_sample_costs`, :class:`~fedbug.system.UnitCosts`) and ``fedbug cost``
(:mod:`fedbug.report.cost`) count one forward + backward of the loss a client trains with, as
:meth:`~fedbug.algorithms.base.ClientSession.loss` gives it (FedROD: the balanced softmax by the
client's class counts), from this one helper."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fedbug.algorithms import Algorithm
from fedbug.algorithms.base import ClientSession
from fedbug.core.flops import LossFn
from fedbug.engine.client_task import client_task


def counting_session(
    cfg: Any, algorithm: Algorithm, labels: Tensor, samples: float
) -> ClientSession:
    """Round 1's session of client 0 (:func:`~fedbug.engine.client_task.client_task`, as the
    round loop builds it; ``samples`` the run's mean client size) on the example batch's
    ``labels``: no payload, no per-client config, no worker runtime."""
    return algorithm.start_client(client_task(cfg, 1, 0, samples), labels)


def counting_loss(cfg: Any, algorithm: Algorithm, labels: Tensor, samples: float) -> LossFn:
    """The loss of :func:`counting_session`. A session that only a round can start (one that
    needs the worker's runtime, the server's payload or the client's width: APF, Fjord and the
    width methods refuse with a ValueError; a user's session may fail otherwise, reading a payload
    or a runtime it does not get here) is counted with the algorithm's own loss, the one those
    sessions train with (HeteroFL's ``masked_loss`` only masks logits: no counted FLOPs)."""
    try:
        return counting_session(cfg, algorithm, labels, samples).loss
    except Exception:  # any session that cannot start outside a round: as before, the algorithm's
        return algorithm.loss
