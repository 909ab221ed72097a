"""Freeze policies, a file per family; importing this package registers them all: every module
in it is imported, so a new one is a new file."""

from fedbug.core.registry import register_all
from fedbug.policies.base import (
    POLICIES,
    EpochAction,
    EpochCtx,
    FreezePolicy,
    Intersection,
    PolicyParams,
    PolicySession,
    StepCtx,
    build_policy,
)
from fedbug.policies.fixed import FixedTop
from fedbug.policies.gradual import BottomUp, TopDown, unfrozen_count
from fedbug.policies.vanilla import Vanilla

__all__ = [
    "POLICIES",
    "EpochAction",
    "EpochCtx",
    "FreezePolicy",
    "Intersection",
    "PolicyParams",
    "PolicySession",
    "StepCtx",
    "build_policy",
    "BottomUp",
    "TopDown",
    "FixedTop",
    "Vanilla",
    "unfrozen_count",
]

register_all(__name__, __path__)
