"""LG-FedAvg (Liang et al. 2020): every unit trains; only the head is shared.

The base ("local representation") is each client's own: loaded from its state (``local.<unit>``)
before training and saved after, the server's initial base until the client is first selected.
The server holds only the head, so there is no global model (``has_global_model`` False).
"""

from __future__ import annotations

from fedbug.algorithms.base import ALGORITHMS
from fedbug.algorithms.bodyhead import BodyHead


@ALGORITHMS.register("lg_fedavg")
class LGFedAvg(BodyHead):
    name = "lg_fedavg"
    has_global_model = False

    def shared_units(self, num_units: int) -> tuple[int, ...]:
        return self._check(num_units).head

    def local_units(self, num_units: int) -> tuple[int, ...]:
        lay = self._check(num_units)
        return lay.base + lay.extra
