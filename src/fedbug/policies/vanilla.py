"""No freezing: every unit trains at every step (FedAvg's client, "Vanilla" in the paper)."""

from __future__ import annotations

from fedbug.policies.base import POLICIES, FreezePolicy, StepCtx


@POLICIES.register("none")
class Vanilla(FreezePolicy):
    name = "none"

    def trainable_units(self, ctx: StepCtx) -> range:
        return range(ctx.num_units)
