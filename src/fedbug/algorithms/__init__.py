"""Algorithms, one file each; importing this package registers them all."""

from fedbug.algorithms import fedavg, feddecorr, feddyn, fedexp, fedprox  # noqa: F401
from fedbug.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    LocalCtx,
    Params,
    ServerStep,
    build_algorithm,
)

__all__ = ["ALGORITHMS", "Algorithm", "LocalCtx", "Params", "ServerStep", "build_algorithm"]
