"""The top k units stay frozen all round: k = 1 is FedBABU's fixed classifier (Oh et al. 2021),
k = 2 the FedBug ablation "fix the last two layers" (Sec. 5.2). Options:
``fixed_top: {fixed_units: k}``; ``fixed_head`` and ``fixed_last_two`` are k = 1 and 2."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from fedbug.errors import ConfigError
from fedbug.policies.base import POLICIES, FreezePolicy, PolicyParams, StepCtx


class FixedParams(PolicyParams):
    """The ``fixed_top:`` block."""

    fixed_units: int = Field(1, ge=1, le=10_000, description="k, the top units kept frozen")


@POLICIES.register("fixed_top")
class FixedTop(FreezePolicy):
    name = "fixed_top"
    params_cls: ClassVar[type[FixedParams] | None] = FixedParams
    k: ClassVar[int | None] = None  # a subclass's fixed k (then it has no options block)
    params: FixedParams | None  # None on a subclass with a fixed k

    @property
    def fixed_units(self) -> int:
        if self.k is not None:
            return self.k
        # no fixed k: this is fixed_top, built with its block (FreezePolicy.__init__ makes a
        # default FixedParams where none is given)
        assert self.params is not None
        return self.params.fixed_units

    def trainable_units(self, ctx: StepCtx) -> range:
        if self.fixed_units >= ctx.num_units:
            raise ConfigError(
                f"fixed_units={self.fixed_units} freezes all {ctx.num_units} units; "
                f"use at most {ctx.num_units - 1}"
            )
        return range(ctx.num_units - self.fixed_units)


@POLICIES.register("fixed_head")
class FixedHead(FixedTop):
    """FixedTop with k = 1 (FedBABU)."""

    name = "fixed_head"
    params_cls = None
    k = 1


@POLICIES.register("fixed_last_two")
class FixedLastTwo(FixedTop):
    """FixedTop with k = 2."""

    name = "fixed_last_two"
    params_cls = None
    k = 2
