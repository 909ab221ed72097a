"""FedBABU (Oh et al. 2021): the head stays at the random initialisation every client shares.

Only the base (and units an algorithm adds, none here) trains, and only the base is sent and
averaged. The head is never trained (``allowed_units``: base + extra, intersected with any freeze
policy) and never uploaded (``shared_units``: base), so the server's head stays bitwise at its
initial value and the global model is base + that fixed head (``has_global_model``). Fine-tuning
the whole model on each client is the personalized evaluation's job, not this class's.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedbug.algorithms.base import ALGORITHMS
from fedbug.algorithms.bodyhead import BodyHead


@ALGORITHMS.register("fedbabu")
class FedBABU(BodyHead):
    name = "fedbabu"
    has_global_model = True

    def shared_units(self, num_units: int) -> tuple[int, ...]:
        return self._check(num_units).base

    def allowed_units(self, step: int, local_steps: int, per_epoch: int) -> Sequence[int] | None:
        return self.split.base + self.split.extra
