"""FedRep (Collins et al. 2021): head epochs first with the base frozen, then the base with the
head frozen; only the base is shared, the head is each client's own.

Local steps (``local_step_count``) for a client with ``per_epoch`` batches an epoch:

* ``local_steps`` unset: K = (head_epochs + local_epochs) * per_epoch; steps 1..head_epochs *
  per_epoch train the head, the rest the base (``local_epochs`` counts the base epochs, as
  PFLlib's ``local_epochs`` / ``plocal_epochs``).
* ``local_steps`` set: K = local_steps, split in proportion head_epochs : local_epochs, the head
  taking round(K * h / (h + E)) steps (halves up), but at least 1 and at most K - 1 when K >= 2
  and h > 0, so both phases run; with K = 1 the one step trains the head; h = 0 trains only the
  base.

Each step's trainable units are the phase's units intersected with the freeze policy; a step
where that leaves nothing is idle. The head (``local.<unit>`` in the client's state) is the
server's initial head until the client is first selected. No global model exists.

The head-phase length is a per-client value: it lives on the client's :class:`FedRepClient`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from fedbug.algorithms.base import ALGORITHMS, ClientSession, Params
from fedbug.algorithms.bodyhead import BodyHead


class FedRepParams(Params):
    head_epochs: int = Field(
        1, ge=0, le=10_000, description="epochs on the head (base frozen) before the base epochs"
    )


def head_steps(local_steps: int, head_epochs: int, local_epochs: int) -> int:
    """Head-phase steps when ``local_steps`` fixes K (see the module docstring)."""
    if head_epochs == 0:
        return 0
    if local_steps <= 1:
        return local_steps
    share = math.floor(local_steps * head_epochs / (head_epochs + local_epochs) + 0.5)
    return min(local_steps - 1, max(1, share))


@ALGORITHMS.register("fedrep")
class FedRep(BodyHead):
    name = "fedrep"
    params_cls = FedRepParams
    params: FedRepParams
    has_global_model = False

    def __init__(self, global_lr: float = 1.0, params: FedRepParams | None = None) -> None:
        super().__init__(global_lr, params)
        self.head_epochs: int = self.params.head_epochs

    def shared_units(self, num_units: int) -> tuple[int, ...]:
        return self._check(num_units).base

    def local_units(self, num_units: int) -> tuple[int, ...]:
        lay = self._check(num_units)
        return lay.head + lay.extra

    def start_client(self, task: Any, labels: Any, runtime: Any = None, gen: Any = None) -> Any:
        return FedRepClient(self, task, labels)


class FedRepClient(ClientSession):
    """One client's round: head steps first, then the base."""

    alg: FedRep

    def __init__(self, alg: FedRep, task: Any, labels: Any) -> None:
        super().__init__(alg, task, labels)
        self.head_steps = 0

    def local_step_count(self, num_samples: int, settings: Any) -> tuple[int, int]:
        per_epoch = max(1, -(-num_samples // settings.batch_size))
        h = self.alg.head_epochs
        if settings.local_steps:
            k = settings.local_steps
            self.head_steps = head_steps(k, h, settings.local_epochs)
        else:
            self.head_steps = h * per_epoch
            k = self.head_steps + settings.local_epochs * per_epoch
        return k, per_epoch

    def allowed_units(self, step: int, local_steps: int, per_epoch: int) -> Sequence[int] | None:
        lay = self.alg.split
        return lay.head if step <= self.head_steps else lay.base + lay.extra
