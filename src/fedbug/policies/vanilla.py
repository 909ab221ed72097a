"""No freezing: every unit trains at every step (FedAvg's client, "Vanilla" in the paper)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedbug.policies.base import POLICIES, StepCtx


@POLICIES.register("none")
@dataclass(frozen=True)
class Vanilla:
    def trainable_units(self, ctx: StepCtx) -> range:
        return range(ctx.num_units)

    @classmethod
    def from_options(cls, **_: Any) -> Vanilla:
        return cls()
