"""FedAvg (McMahan et al. 2017) with a global learning rate eta_g (FedBug Algorithm 2)."""

from __future__ import annotations

from fedbug.algorithms.base import ALGORITHMS, Algorithm


@ALGORITHMS.register("fedavg")
class FedAvg(Algorithm):
    """Local SGD on the loss; server theta <- theta + eta_g * mean Delta_i."""

    name = "fedavg"
