"""The top k units stay frozen all round: k = 1 is FedBABU's fixed classifier (Oh et al. 2021),
k = 2 the FedBug ablation "fix the last two layers" (Sec. 5.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedbug.errors import ConfigError
from fedbug.policies.base import POLICIES, StepCtx


@POLICIES.register("fixed_top")
@dataclass(frozen=True)
class FixedTop:
    fixed_units: int = 1

    def __post_init__(self) -> None:
        if self.fixed_units < 1:
            raise ConfigError(f"fixed_units must be at least 1; got {self.fixed_units}")

    @classmethod
    def from_options(cls, fixed_units: int = 1, **_: Any) -> FixedTop:
        return cls(fixed_units=fixed_units)

    def trainable_units(self, ctx: StepCtx) -> range:
        if self.fixed_units >= ctx.num_units:
            raise ConfigError(
                f"fixed_units={self.fixed_units} freezes all {ctx.num_units} units; "
                f"use at most {ctx.num_units - 1}"
            )
        return range(ctx.num_units - self.fixed_units)


@POLICIES.register("fixed_head")
@dataclass(frozen=True)
class FixedHead(FixedTop):
    """FixedTop with k = 1 (FedBABU)."""

    @classmethod
    def from_options(cls, **_: Any) -> FixedHead:
        return cls(fixed_units=1)


@POLICIES.register("fixed_last_two")
@dataclass(frozen=True)
class FixedLastTwo(FixedTop):
    """FixedTop with k = 2."""

    @classmethod
    def from_options(cls, **_: Any) -> FixedLastTwo:
        return cls(fixed_units=2)
