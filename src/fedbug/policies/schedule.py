"""FedSeq's round schedules (Sec. 3.1-3.2, Algorithm 1): base sub-layers unfreeze by round.

The base's K sub-layers (input to output) unfreeze at rounds t_1 <= ... <= t_K: at global round
t = 1..T the sub-layers with t_k < t train ("if t > t_k, unfreeze"), m(t) of them. *Vanilla*
trains sub-layers 1..m(t) (input side first), *anti* K-m(t)+1..K (output side first). Nothing
re-freezes, and sub-layers with the same t_k unfreeze together. By default
t_k = floor((k-1)T/K), K equal phases; Sec. 4's T=300, K=3 gives 0/100/200, i.e. phases
1-100, 101-200, 201-300.

The schedule acts on the base only: every unit outside the sub-layers (the head, an algorithm's
extra units) is left to the algorithm, which the client intersects with its allowed units.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedbug.errors import ConfigError
from fedbug.policies.base import FreezePolicy, StepCtx

SCHEDULES = ("vanilla", "anti")


def default_unfreeze_rounds(num_sublayers: int, rounds: int) -> tuple[int, ...]:
    """t_k = floor((k-1)T/K) for k = 1..K: K phases of (nearly) equal length."""
    if num_sublayers < 1:
        raise ConfigError("a round schedule needs at least one base sub-layer")
    if rounds < 1:
        raise ConfigError(f"a round schedule needs at least one round; got rounds={rounds}")
    return tuple((k - 1) * rounds // num_sublayers for k in range(1, num_sublayers + 1))


def unfreeze_rounds_problem(ts: Sequence[int], rounds: int | None) -> str | None:
    """What is wrong with t_1..t_K whatever the model (the config refuses it before the data
    loads; their count, one per base sub-layer, needs the model): None if nothing."""
    if ts and ts[0] != 0:
        return (
            f"unfreeze_rounds must start at 0 (the first sub-layer trains from round 1); "
            f"got {list(ts)}"
        )
    if any(b < a for a, b in zip(ts, ts[1:])):
        return f"unfreeze_rounds must be non-decreasing; got {list(ts)}"
    if ts and rounds is not None and ts[-1] >= rounds:
        return (
            f"unfreeze_rounds {list(ts)}: the last sub-layer unfreezes after round "
            f"{ts[-1]}, but there are only {rounds} rounds; use values below {rounds}"
        )
    return None


@dataclass(frozen=True)
class RoundSchedule(FreezePolicy):
    """Which base sub-layers train in a round (a policy the engine intersects with the
    config's own, :class:`~fedbug.policies.base.Intersection`). ``sublayers``: the layout's
    base sub-layers (groups of unit indices, input to output); ``unfreeze_rounds``:
    t_1..t_K; ``rounds``: T, which t_K must stay below (checked when given)."""

    mode: str
    sublayers: tuple[tuple[int, ...], ...]
    unfreeze_rounds: tuple[int, ...]
    rounds: int | None = None
    params = None  # no options block: the schedule comes from the config's FedSeq keys

    def __post_init__(self) -> None:
        object.__setattr__(self, "sublayers", tuple(tuple(g) for g in self.sublayers))
        object.__setattr__(self, "unfreeze_rounds", tuple(self.unfreeze_rounds))
        if self.mode not in SCHEDULES:
            raise ConfigError(
                f"unknown schedule {self.mode!r}; known: none, {', '.join(SCHEDULES)}"
            )
        k, ts = len(self.sublayers), self.unfreeze_rounds
        if k < 1:
            raise ConfigError("a round schedule needs at least one base sub-layer")
        if len(ts) != k:
            raise ConfigError(
                f"unfreeze_rounds has {len(ts)} entries but the base has {k} sub-layers; "
                f"give one round per sub-layer, e.g. "
                f"{list(default_unfreeze_rounds(k, self.rounds or k))}"
            )
        problem = unfreeze_rounds_problem(ts, self.rounds)
        if problem is not None:
            raise ConfigError(problem)

    @classmethod
    def build(
        cls,
        mode: str,
        sublayers: Sequence[Sequence[int]],
        rounds: int,
        unfreeze_rounds: Sequence[int] | None = None,
    ) -> RoundSchedule:
        """The schedule for T = ``rounds``, with the default t_k when none are given."""
        ts = (
            default_unfreeze_rounds(len(sublayers), rounds)
            if unfreeze_rounds is None
            else tuple(unfreeze_rounds)
        )
        return cls(mode, tuple(tuple(g) for g in sublayers), ts, rounds)

    @property
    def num_sublayers(self) -> int:
        return len(self.sublayers)

    @property
    def base_units(self) -> frozenset[int]:
        return frozenset(u for g in self.sublayers for u in g)

    def unfrozen_count(self, round: int) -> int:
        """m(t) = #{k : t_k < t}."""
        return sum(1 for t in self.unfreeze_rounds if t < round)

    def round_units(self, round: int) -> tuple[int, ...]:
        """The base units scheduled in ``round``, ascending."""
        groups = self.trained_sublayers(round)
        return tuple(sorted(u for s in groups for u in self.sublayers[s - 1]))

    def download_units(self, round: int, shared: frozenset[int]) -> frozenset[int]:
        """The scheduled base units and the shared units outside the base: a sub-layer not
        yet unfrozen still holds its initial values, which every client has."""
        return frozenset(u for u in shared if u not in self.base_units) | (
            shared & frozenset(self.round_units(round))
        )

    def trained_sublayers(self, round: int, num_sublayers: int | None = None) -> list[int]:
        """The sub-layers (1-based, input to output) that train in ``round``."""
        k, m = self.num_sublayers, self.unfrozen_count(round)
        if self.mode == "vanilla":
            return list(range(1, m + 1))
        return list(range(k - m + 1, k + 1))

    def trainable_units(self, ctx: StepCtx) -> tuple[int, ...]:
        """The scheduled base units and every unit outside the base (head, extra units)."""
        base = self.base_units
        scheduled = set(self.round_units(ctx.round))
        return tuple(u for u in range(ctx.num_units) if u in scheduled or u not in base)
