"""Freeze policies, one file each; importing this package registers them all."""

from fedbug.policies import fixed, freezefl, gradual, vanilla  # noqa: F401  (registration)
from fedbug.policies.base import POLICIES, FreezePolicy, StepCtx, build_policy
from fedbug.policies.fixed import FixedTop
from fedbug.policies.gradual import BottomUp, TopDown, unfrozen_count
from fedbug.policies.vanilla import Vanilla

__all__ = [
    "POLICIES",
    "FreezePolicy",
    "StepCtx",
    "build_policy",
    "BottomUp",
    "TopDown",
    "FixedTop",
    "Vanilla",
    "unfrozen_count",
]
