"""What a freeze policy is: which units may train at local step k of round r for client i.

A policy is one class with a client half and, where it needs one, a server half; every hook the
engine calls is declared here with a default that does nothing, so a new policy overrides only
what it changes:

client half
    :meth:`FreezePolicy.trainable_units` (required): the units that train at a step.
    :meth:`FreezePolicy.start_client`: a :class:`PolicySession` for one client's round, the place
    for per-client values (FreezeFL's probe decision); by default it asks the policy at each step.
    :meth:`PolicySession.end_of_epoch`: restore or restart at an epoch's end (FreezeFL's probe).
    :meth:`PolicySession.finish`: fill the typed result's fields the policy decides
    (``n_frozen``, ``charged_time``).

server half
    :meth:`FreezePolicy.setup` (the run's unit layout, once, wherever the units are built),
    :meth:`FreezePolicy.setup_server` (the simulated system, once), :meth:`client_config`
    (what each client is sent with the weights), :meth:`round_deadline` (the deadline it sets
    this round), :meth:`end_round` (the round's client times), :meth:`state_dict` /
    :meth:`load_state_dict` (an exact resume).

Options come from ``params_cls``, a block named after the policy in a config
(``bottom_up: {gu_ratio: 0.4}``); :meth:`check_config` returns why a config cannot run the
policy (``None``: it can), gathered in :func:`fedbug.config.compat.check_compatible`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict
from torch import Tensor

from fedbug.core.registry import Registry

if TYPE_CHECKING:
    from fedbug.config import BaseConfig
    from fedbug.core.layout import Layout
    from fedbug.core.protocol import ClientResult, ClientTask
    from fedbug.core.units import ParamSpace
    from fedbug.system import SystemModel


class PolicyParams(BaseModel):
    """Base of a policy's options block (``bottom_up: {gu_ratio: ...}`` in a config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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


@dataclass
class EpochCtx:
    """What a policy sees at the end of a local epoch (FreezeFL's probe): epochs done and
    planned, the task, the local and received weights (flat, unit by unit)."""

    epoch: int
    epochs: int
    task: ClientTask
    space: ParamSpace
    local: Tensor
    received: Tensor


@dataclass(frozen=True)
class EpochAction:
    """A policy's answer at the end of an epoch: units to put back to the received weights (and
    freeze, as the policy then says), or start the round over (``restart``)."""

    restore: tuple[int, ...] = ()
    restart: bool = False


class PolicySession:
    """A policy's half of one client's local training in one round (one object per client, so
    per-client values never sit on the policy every client shares)."""

    def __init__(self, policy: FreezePolicy, task: ClientTask) -> None:
        self.policy = policy
        self.task = task

    def trainable_units(self, ctx: StepCtx) -> Sequence[int]:
        """The units that train at this step (ascending); by default the policy's answer."""
        return self.policy.trainable_units(ctx)

    def end_of_epoch(self, ctx: EpochCtx) -> EpochAction | None:
        """Called after every local epoch but the last; None: go on."""
        return None

    def finish(self, result: ClientResult) -> None:
        """Fill the fields of the client's result that this policy decides; nothing by default."""
        return None


POLICIES: Registry[type[FreezePolicy]] = Registry("freeze policy")


class FreezePolicy:
    """Base of every freeze policy; see the module docstring for the hooks."""

    name: ClassVar[str] = "base"
    params_cls: ClassVar[type[PolicyParams] | None] = None

    def __init__(self, params: PolicyParams | None = None) -> None:
        self.params = (
            params if params is not None else (self.params_cls() if self.params_cls else None)
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})" if self.params else type(self).__name__

    @classmethod
    def check_config(cls, cfg: BaseConfig) -> str | None:
        """Why ``cfg`` cannot run this policy, or None."""
        return None

    # -- client half -------------------------------------------------------------------
    def trainable_units(self, ctx: StepCtx) -> Sequence[int]:
        """The trainable units (indices into the ordered units, input to output), ascending:
        a ``range`` for the contiguous policies, a tuple in general."""
        raise NotImplementedError

    def start_client(self, task: ClientTask) -> PolicySession:
        """The policy's half of one client's round."""
        return PolicySession(self, task)

    # -- server half -------------------------------------------------------------------
    def setup(self, layout: Layout) -> None:
        """Called once the model's units are laid out (by every builder: the server, worker
        processes, Flower nodes), before the policy is asked anything; a policy whose answers
        outside a step (:meth:`trained_sublayers`) depend on the unit count or the base
        sub-layers reads them here. Nothing by default."""
        return None

    def setup_server(self, system: SystemModel | None, cfg: BaseConfig) -> None:
        """Called once the simulated system (None without a ``system:`` block) is built."""
        return None

    def client_config(self, client: int) -> dict[str, Any]:
        """What client ``client`` is sent with the weights this round (its ``task.extra``)."""
        return {}

    def round_deadline(self) -> float | None:
        """The deadline this policy gives this round's clients (FreezeFL's soft deadline T_r);
        None: none."""
        return None

    def end_round(self, times: Sequence[float]) -> None:
        """The simulated exchange times of the round's clients, after aggregation."""
        return None

    def download_units(self, round: int, shared: frozenset[int]) -> frozenset[int]:
        """Of the ``shared`` units, those a client must download in ``round``; a policy may
        leave out units every client already holds (FedSeq's schedule: base sub-layers not yet
        unfrozen keep their initial values). All of them by default."""
        return shared

    def trained_sublayers(self, round: int, num_sublayers: int) -> list[int]:
        """The layout's base sub-layers (1-based, input to output) this policy lets train in
        ``round``, as the round record states them; all by default."""
        return list(range(1, num_sublayers + 1))

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class _IntersectionSession(PolicySession):
    def __init__(
        self, policy: Intersection, sessions: list[PolicySession], task: ClientTask
    ) -> None:
        super().__init__(policy, task)
        self.sessions = sessions

    def trainable_units(self, ctx: StepCtx) -> tuple[int, ...]:
        allowed = set(range(ctx.num_units))
        for s in self.sessions:
            allowed &= set(s.trainable_units(ctx))
        return tuple(sorted(allowed))

    def end_of_epoch(self, ctx: EpochCtx) -> EpochAction | None:
        for s in self.sessions:
            action = s.end_of_epoch(ctx)
            if action is not None:
                return action
        return None

    def finish(self, result: ClientResult) -> None:
        for s in self.sessions:
            s.finish(result)


class Intersection(FreezePolicy):
    """Units that every one of several policies lets train (masks of several policies intersect,
    e.g. FedBug's gradual unfreezing inside a FedSeq round schedule). Each hook goes to every
    member."""

    name = "intersection"

    def __init__(self, policies: tuple[FreezePolicy, ...]) -> None:
        super().__init__()
        self.policies = tuple(policies)

    def __repr__(self) -> str:
        return f"Intersection({', '.join(map(repr, self.policies))})"

    def trainable_units(self, ctx: StepCtx) -> tuple[int, ...]:
        allowed = set(range(ctx.num_units))
        for p in self.policies:
            allowed &= set(p.trainable_units(ctx))
        return tuple(sorted(allowed))

    def start_client(self, task: ClientTask) -> PolicySession:
        return _IntersectionSession(self, [p.start_client(task) for p in self.policies], task)

    def setup(self, layout: Layout) -> None:
        for p in self.policies:
            p.setup(layout)

    def setup_server(self, system: SystemModel | None, cfg: BaseConfig) -> None:
        for p in self.policies:
            p.setup_server(system, cfg)

    def client_config(self, client: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in self.policies:
            out.update(p.client_config(client))
        return out

    def round_deadline(self) -> float | None:
        deadlines = [d for p in self.policies if (d := p.round_deadline()) is not None]
        return min(deadlines) if deadlines else None

    def end_round(self, times: Sequence[float]) -> None:
        for p in self.policies:
            p.end_round(times)

    def download_units(self, round: int, shared: frozenset[int]) -> frozenset[int]:
        for p in self.policies:  # a unit any member says clients hold is not sent
            shared = p.download_units(round, shared)
        return shared

    def trained_sublayers(self, round: int, num_sublayers: int) -> list[int]:
        trained = set(range(1, num_sublayers + 1))
        for p in self.policies:
            trained &= set(p.trained_sublayers(round, num_sublayers))
        return sorted(trained)

    def state_dict(self) -> dict[str, Any]:
        return {str(i): p.state_dict() for i, p in enumerate(self.policies)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, p in enumerate(self.policies):
            p.load_state_dict(state.get(str(i), {}))


def build_policy(name: str, params: PolicyParams | None = None, **options: Any) -> FreezePolicy:
    """The policy registered as ``name`` with its options block (None: the defaults), or with
    the block's fields given as keywords (``build_policy("bottom_up", gu_ratio=0.4)``)."""
    cls = POLICIES.get(name)
    if options:
        if params is not None or cls.params_cls is None:
            raise TypeError(f"policy {name}: give its options as keywords or a block, not both")
        params = cls.params_cls(**options)
    return cls(params)
