"""FedPer (Arivazhagan et al. 2019): every unit trains; only the base is shared.

The head is each client's own: loaded from its state (``local.<unit>``) before training and saved
after, the server's initial head until the client is first selected. The server never sees a
head, so there is no global model to evaluate (``has_global_model`` False).
"""

from __future__ import annotations

from fedbug.algorithms.base import ALGORITHMS
from fedbug.algorithms.bodyhead import BodyHead


@ALGORITHMS.register("fedper")
class FedPer(BodyHead):
    name = "fedper"
    has_global_model = False

    def shared_units(self, num_units: int) -> tuple[int, ...]:
        return self._check(num_units).base

    def local_units(self, num_units: int) -> tuple[int, ...]:
        lay = self._check(num_units)
        return lay.head + lay.extra
