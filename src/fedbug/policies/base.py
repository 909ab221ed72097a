"""What a freeze policy is: which units may train at local step k of round r for client i."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from fedbug.registry import Registry


@dataclass(frozen=True)
class StepCtx:
    """Where a client is in its local training: step ``step`` (1-based) of ``local_steps``."""

    step: int
    local_steps: int
    num_units: int
    round: int = 1
    client: int = 0


class FreezePolicy(Protocol):
    """Returns the trainable units (indices into the ordered units, input to output).

    The result is a ``range``: every policy here trains a contiguous block of units, and two
    ranges intersect to a range, so policies compose.
    """

    def trainable_units(self, ctx: StepCtx) -> range: ...


POLICIES: Registry[Any] = Registry("freeze policy")


def build_policy(name: str, **options: Any) -> FreezePolicy:
    """Build the policy registered as ``name`` from the config's policy options."""
    return POLICIES.get(name).from_options(**options)
