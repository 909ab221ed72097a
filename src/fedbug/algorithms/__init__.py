"""Algorithms, one file each; importing this package registers them all."""

from fedbug.algorithms import (  # noqa: F401  (registration)
    fedavg,
    fedbabu,
    feddecorr,
    feddyn,
    fedexp,
    fedper,
    fedprox,
    fedrep,
    fedrod,
    fjord,
    lg_fedavg,
)
from fedbug.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    LocalCtx,
    Params,
    ServerStep,
    build_algorithm,
)

__all__ = ["ALGORITHMS", "Algorithm", "LocalCtx", "Params", "ServerStep", "build_algorithm"]
