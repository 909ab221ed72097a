"""Local-only training: every client trains its own model on its own data and never shares it,
the floor any federated method has to beat (the "Local" row of FedPer, FedRep and FedBABU's
tables; PFLlib's ``Local``).

Every unit is the client's own, kept in its state between rounds and starting from the server's
initial weights; the server's weights never move, nothing is uploaded, and the evaluation is
personalized (each client's model on its own test data), so a run needs ``evaluation:
personalized``.
"""

from __future__ import annotations

from fedbug.algorithms.base import ALGORITHMS, Algorithm


@ALGORITHMS.register("local")
class LocalOnly(Algorithm):
    name = "local"
    has_global_model = False

    def shared_units(self, num_units: int) -> tuple[int, ...]:
        return ()

    def local_units(self, num_units: int) -> tuple[int, ...]:
        return tuple(range(num_units))
