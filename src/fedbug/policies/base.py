"""What a freeze policy is: which units may train at local step k of round r for client i."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fedbug.registry import Registry


@dataclass(frozen=True)
class StepCtx:
    """Where a client is: local step ``step`` (1-based) of ``local_steps``, in global round
    ``round`` (1-based) of ``rounds``."""

    step: int
    local_steps: int
    num_units: int
    round: int = 1
    client: int = 0
    rounds: int = 1


class FreezePolicy(Protocol):
    """Returns the trainable units (indices into the ordered units, input to output), ascending:
    a ``range`` for the contiguous policies, a tuple in general."""

    def trainable_units(self, ctx: StepCtx) -> Sequence[int]: ...


@dataclass(frozen=True)
class Intersection:
    """Units that every one of several policies lets train (masks of several policies intersect,
    e.g. FedBug's gradual unfreezing inside a FedSeq round schedule)."""

    policies: tuple[FreezePolicy, ...]

    def trainable_units(self, ctx: StepCtx) -> tuple[int, ...]:
        allowed = set(range(ctx.num_units))
        for p in self.policies:
            allowed &= set(p.trainable_units(ctx))
        return tuple(sorted(allowed))

    def __getattr__(self, name: str) -> Any:
        # the optional client hooks (end_of_epoch, client_metrics) of the one member having them
        if name in ("end_of_epoch", "client_metrics"):
            for p in self.policies:
                hook = getattr(p, name, None)
                if hook is not None:
                    return hook
        raise AttributeError(name)


POLICIES: Registry[Any] = Registry("freeze policy")


def build_policy(name: str, **options: Any) -> FreezePolicy:
    """Build the policy registered as ``name`` from the config's policy options."""
    return POLICIES.get(name).from_options(**options)
