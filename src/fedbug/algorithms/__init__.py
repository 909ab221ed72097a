"""Algorithms, one file each; importing this package imports (and so registers) every module
in it: a new algorithm is a new file, nothing else to edit."""

from fedbug.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientSession,
    LocalCtx,
    Params,
    ServerStep,
    build_algorithm,
)
from fedbug.core.registry import register_all

register_all(__name__, __path__)

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClientSession",
    "LocalCtx",
    "Params",
    "ServerStep",
    "build_algorithm",
]
