"""The one builder of a client's round config (:class:`~fedbug.core.protocol.ClientTask`).

The round loop (:meth:`fedbug.engine.rounds.RoundLoop.client_tasks`) sends each selected client
:func:`client_task` of its config, the round, the client, the run's mean client size
(:func:`mean_samples`), the algorithm's payload and the per-client config of the algorithm and
the policy (:meth:`fedbug.engine.simulation.Simulation.client_extra`); the learning rate is
:func:`lr_at` the round. Whatever rebuilds a client's round elsewhere passes what it has to the
same function, so a field added to the task, or a change in how the rate is decayed, reaches
every copy:

* ``fedbug attack`` (:mod:`fedbug.attack.unroll`, :mod:`fedbug.attack.counts`) rebuilds a
  recorded round: the recorded rate (the round's, as the update holds it), the client's own
  sample count for the mean (the run's mean is not recorded; nothing the attack builds reads
  it), no payload (the server's state is not recorded: SCAFFOLD's control variate) and no
  per-client config (a policy that reads it is said so in the attack's findings);
* ``fedbug cost`` (:mod:`fedbug.report.cost`) counts round 1 of a modelled client
  (``samples_per_client``, no data loaded), with no payload nor per-client config (the methods
  it counts have none);
* personalized fine-tuning (:mod:`fedbug.engine.pfl`) runs after the last round at round
  :data:`~fedbug.engine.pfl.FINETUNE_ROUND` with the fine-tuning rate and the client's own size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from fedbug.core.protocol import ClientTask


def lr_at(cfg: Any, round: int) -> float:
    """The clients' learning rate in ``round`` (1-based): ``lr`` decayed by ``lr_decay`` a
    round after the first."""
    return float(cfg.lr * cfg.lr_decay ** (round - 1))


def mean_samples(sizes: Sequence[int]) -> float:
    """The mean training samples of a client, over the clients' ``sizes`` (FedDyn's weight)."""
    return sum(sizes) / len(sizes)


def client_task(
    cfg: Any,
    round: int,
    client: int,
    mean: float,
    *,
    payload: Mapping[str, Tensor] | None = None,
    extra: Mapping[str, Any] | None = None,
    lr: float | None = None,
    seed: int | None = None,
) -> ClientTask:
    """Client ``client``'s config for ``round`` of the run of ``cfg`` (its seed and rounds):
    ``mean`` the run's mean client size (:func:`mean_samples`), ``payload`` what the algorithm
    sends every client (shared, not copied), ``extra`` the client's own config, ``lr`` the rate
    where the caller holds it (a recorded round's, fine-tuning's), else :func:`lr_at`;
    ``seed`` the seed the client's generator is addressed by, where not the run's."""
    return ClientTask(
        round=round,
        client=client,
        seed=cfg.seed if seed is None else seed,
        lr=lr_at(cfg, round) if lr is None else float(lr),
        mean_samples=float(mean),
        payload=payload if isinstance(payload, dict) else dict(payload or {}),
        rounds=cfg.rounds,
        extra=dict(extra or {}),
    )
