"""What an algorithm is: a local objective (client half) and a server update (server half).

Both halves live in one class, and every hook the engine calls is declared on :class:`Algorithm`
with FedAvg's behaviour (mostly: nothing) as the default, so a new algorithm overrides only what
it changes. The client half only ever touches the *trainable* regions of the flat weight vector
(the slices of the units a freeze policy lets train), so a frozen unit takes no proximal, dynamic
or decay term: freezing reaches an algorithm only through those regions.

Per-client values (FedROD's class counts, FedRep's head steps, Fjord's width) live on a
:class:`ClientSession`, one per client and round (:meth:`Algorithm.start_client`), never on the
algorithm object every client shares. Extra tensors a client sends (SCAFFOLD's control-variate
change) go in :meth:`Algorithm.client_extras`; the server reads their per-key sums from the
round's aggregate (:meth:`fedbug.engine.aggregate.Aggregate.extra_sum`).

A flag that goes with a hook is never set apart from it: ``stateful_clients`` and
``needs_features`` follow from whether a class overrides their hooks, and ``has_global_model`` and
``extra_modules`` are checked against theirs, when the class is defined (:func:`check_flags`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn

from fedbug.core.layout import Layout
from fedbug.core.registry import Registry
from fedbug.core.tasks import Classification, Task
from fedbug.core.units import ParamSpace

if TYPE_CHECKING:
    from fedbug.config import BaseConfig
    from fedbug.core.protocol import ClientResult, ClientTask, TrainSettings
    from fedbug.engine.aggregate import Aggregate
    from fedbug.engine.client import ClientRuntime
    from fedbug.system import SystemModel


class Params(BaseModel):
    """Base of an algorithm's hyperparameter block (``fedprox: {mu: ...}`` in a config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class LocalCtx:
    """What the client half sees during local training.

    ``weights``/``grads``/``received`` are the full flat local weights, their gradient and the
    received global weights; ``regions`` the slices of the trainable units (one slice per run of
    consecutive trainable units; usually one). Only those entries may be read as gradients:
    use :meth:`trainable`. ``state`` is this client's persistent state (e.g. FedDyn's lambda_i).
    Under ``executor: cohort`` an algorithm that declares ``vectorised_step`` gets one context
    for a group of clients: ``weights``, ``grads``, ``received`` and each state tensor stacked
    ([clients, total]), ``num_samples`` a [clients, 1] tensor; its step hooks index the last
    axis (``[..., r]``, as :meth:`trainable` does) and scale by tensors where a scalar was.
    """

    space: ParamSpace
    weights: Tensor
    grads: Tensor
    received: Tensor
    regions: list[slice]
    state: dict[str, Tensor]
    num_samples: int | Tensor
    mean_samples: float
    payload: dict[str, Tensor] = field(default_factory=dict)
    lr: float = 0.0
    unit_steps: list[int] = field(default_factory=list)  # local steps each unit trained

    def trainable(self) -> Iterator[tuple[Tensor, Tensor, Tensor, slice]]:
        """(weights, grads, received, slice) views of each trainable region (``[..., r]``: the
        same code serves one client's vectors and the cohort executor's stacked ones)."""
        for r in self.regions:
            yield self.weights[..., r], self.grads[..., r], self.received[..., r], r


@dataclass
class ServerStep:
    """Result of a server update: the next global weights, the weights to evaluate, the new
    server state and any per-round figures the algorithm reports."""

    weights: Tensor
    eval_weights: Tensor
    state: dict[str, Tensor]
    metrics: dict[str, float] = field(default_factory=dict)


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


class ClientSession:
    """An algorithm's half of one client's local training in one round.

    The defaults ask the algorithm; an algorithm with per-client values returns its own session
    from :meth:`Algorithm.start_client` and keeps them here."""

    def __init__(self, alg: Algorithm, task: ClientTask, labels: Tensor) -> None:
        self.alg = alg
        self.task = task
        self.labels = labels

    def local_step_count(self, num_samples: int, settings: TrainSettings) -> tuple[int, int]:
        """(K, steps per epoch) of this client's local training."""
        return self.alg.local_step_count(num_samples, settings)

    def allowed_units(self, step: int, local_steps: int, per_epoch: int) -> Sequence[int] | None:
        """Units the algorithm lets train at a local step (None: all); the client intersects
        this with the freeze policy (FedBABU: never the head; FedRep: head, then base)."""
        return self.alg.allowed_units(step, local_steps, per_epoch)

    def loss(self, output: Any, y: Tensor) -> Tensor:
        """This client's training loss of the model's output."""
        return self.alg.loss(output, y)

    def before_step(self, x: Tensor, y: Tensor) -> None:
        """Before each local step's forward pass (Fjord: draw the step's sub-model)."""
        return None

    def after_step(self) -> None:
        """After each optimiser step (Fjord: put back the entries outside the sub-model)."""
        return None

    def finish(self, result: ClientResult) -> None:
        """Fill the fields of the client's result this algorithm decides (Fjord: its width, its
        sub-model's bytes and FLOPs, the entries it holds); nothing by default."""
        return None


class Algorithm:
    """FedAvg's behaviour; other algorithms override a hook or two.

    Client half: ``start_client`` (a per-client :class:`ClientSession`), ``extra_loss`` (terms on
    the loss, e.g. FedDecorr) and ``adjust_grads`` (terms whose gradient is known in closed form,
    added to the gradient of the trainable regions: exact and cheaper than building them into the
    graph; ``adjust_grads_after_clipping`` for terms gradient clipping must not see),
    ``finish_client`` (new client state), ``client_extras`` (extra tensors sent).
    Server half: ``client_config`` and ``payload`` (what clients are sent), ``server_update``
    from the aggregate of the round's updates, ``setup_system`` (the simulated devices).

    Flags (class attributes the engine reads; see :func:`check_flags`): ``stateful_clients``
    and ``needs_features`` are computed from the hooks, the others are declared.
    """

    name: ClassVar[str] = "base"
    params_cls: ClassVar[type[Params] | None] = None
    #: computed: whether each client's state is kept between rounds (the class overrides
    #: ``init_client_state`` or ``finish_client``)
    stateful_clients: ClassVar[bool] = False
    #: computed: whether ``extra_loss`` is given the classifier's input (the class overrides
    #: ``extra_loss``; None otherwise)
    needs_features: ClassVar[bool] = False
    #: declared: this class's own ``adjust_grads`` / ``adjust_grads_after_clipping`` also take
    #: the cohort executor's stacked context (see :class:`LocalCtx`), and its ``extra_loss`` runs
    #: inside the executor's vectorised map for one client (its features; of ``ctx`` only what
    #: a group shares); a subclass overriding them declares it again (the cohort executor reads
    #: the class that defines each hook)
    vectorised_step: ClassVar[bool] = False
    #: declared: whether each sample's training loss depends on that sample (and the weights)
    #: alone; False for a loss that reads the client's whole data set (class counts, the classes
    #: present), which breaks DP-SGD's per-sample sensitivity (``dp_sgd:`` refuses it)
    loss_per_sample: ClassVar[bool] = True
    #: False: the server's weights alone are no model to evaluate, some units living only on the
    #: clients (needs ``local_units``); evaluation must then be personalized
    has_global_model: ClassVar[bool] = True
    #: whether the algorithm treats the model's last units as a head apart from its base
    #: (personalized methods, set by ``BodyHead``); then the model needs at least one base unit
    #: and one head unit
    splits_body_head: ClassVar[bool] = False
    #: the top-level modules ``wrap_model`` adds (FedROD's personal head): their units are the
    #: algorithm's, not the freeze policy's (needs ``wrap_model``)
    extra_modules: ClassVar[tuple[str, ...]] = ()
    #: declared: a client's update holds a subset of each unit's entries (a sub-model: Fjord,
    #: APF's active entries, the width methods), averaged entry by entry over the clients
    #: holding it (``ClientResult.entries``); secure
    #: aggregation, which sums whole units, refuses it
    sends_sub_models: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_flags(cls)

    @classmethod
    def overrides(cls, *hooks: str) -> bool:
        """Whether this class overrides any of ``hooks`` of :class:`Algorithm` (itself or
        through a base class)."""
        return any(
            inspect.getattr_static(cls, h) is not inspect.getattr_static(Algorithm, h)
            for h in hooks
        )

    @classmethod
    def check_config(cls, cfg: BaseConfig) -> str | None:
        """Why ``cfg`` cannot run this algorithm (one sentence naming the fix), or None."""
        return None

    @classmethod
    def sends_extras(cls, cfg: BaseConfig) -> bool:
        """Whether a client's result under ``cfg`` carries tensors beside its delta
        (``ClientResult.extras``, which the server reads as they are: ``dp:`` refuses them):
        True where the class overrides ``client_extras``. A class whose session writes
        ``result.extras`` in ``finish`` overrides this too (SLT's stage); tests/
        test_compat_refusals.py runs every registered algorithm, each option of its block, and
        holds it to what its clients send."""
        return cls.overrides("client_extras")

    def __init__(
        self, global_lr: float = 1.0, params: Params | None = None, task: Task | None = None
    ) -> None:
        self.global_lr = global_lr
        self.task: Task = task if task is not None else Classification()
        self.params = (
            params if params is not None else (self.params_cls() if self.params_cls else None)
        )
        self.layout: Layout | None = None

    def setup(self, layout: Layout) -> None:
        """Learn the model's base/head layout (called once the units are known)."""
        self.layout = layout

    # -- which units are whose -----------------------------------------------------------
    def shared_units(self, num_units: int) -> tuple[int, ...]:
        """Units the server holds and averages; the rest never leave the client."""
        return tuple(range(num_units))

    def local_units(self, num_units: int) -> tuple[int, ...]:
        """Units each client keeps as its own (personal parts), persisted between rounds."""
        return ()

    def shared_mask(self, num_units: int) -> list[bool]:
        """:meth:`shared_units` as one flag per unit (what is downloaded, what may be uploaded);
        a helper, not a hook: override :meth:`shared_units`."""
        shared = set(self.shared_units(num_units))
        return [u in shared for u in range(num_units)]

    def allowed_units(self, step: int, local_steps: int, per_epoch: int) -> Sequence[int] | None:
        """Units this algorithm lets train at a local step (None: all); the engine intersects
        this with the freeze policy (FedBABU: never the head; FedRep: head, then base)."""
        return None

    def local_step_count(self, num_samples: int, settings: TrainSettings) -> tuple[int, int]:
        """(K, steps per epoch) of local training; FedRep adds its head epochs."""
        per_epoch = max(1, -(-num_samples // settings.batch_size))
        k = settings.local_steps if settings.local_steps else settings.local_epochs * per_epoch
        return k, per_epoch

    def start_client(
        self,
        task: ClientTask,
        labels: Tensor,
        runtime: ClientRuntime | None = None,
        gen: torch.Generator | None = None,
    ) -> ClientSession:
        """This algorithm's half of one client's round (``labels``: the client's training
        labels; ``runtime``: the worker's :class:`~fedbug.engine.client.ClientRuntime`; ``gen``: the
        client's generator, addressed by (seed, round, client))."""
        return ClientSession(self, task, labels)

    def client_config(self, client: int, system: SystemModel | None) -> dict[str, Any]:
        """What client ``client`` is sent with the weights this round (its ``task.extra``;
        Fjord: its width). ``system``: the simulated devices, or None."""
        return {}

    def setup_run(self, cfg: BaseConfig, example: Tensor) -> None:
        """Called once the model is built and cut into units (``cfg``: the run's config;
        ``example``: a prepared batch of the data), wherever a run's clients are built: compute
        what needs the model and the config together, refusing (ConfigError) what cannot run.
        In-process executors (sequential, cohort, processes) build the run before its folder
        is written, so such a refusal writes nothing; on Flower the ServerApp builds it after
        the folder exists, and the refusal ends the run as failed (its log names it). Nothing
        by default."""
        return None

    def setup_system(
        self, system: SystemModel, model: nn.Module, x: Tensor, y: Tensor
    ) -> dict[str, Any]:
        """Called once with the simulated system and an example batch (an algorithm that
        trains sub-models: their per-sample FLOPs); returns figures for the summary's
        ``clients`` block (JSON-ready), none by default."""
        return {}

    # -- the model and its loss ----------------------------------------------------------
    def wrap_model(
        self, model: nn.Module, classifier: str, order: Sequence[str] | None = None
    ) -> nn.Module:
        """A model with the algorithm's own parts added (FedROD's personal head); ``order``:
        the model's parameter-owning modules in the order its forward pass calls them (the
        classifier last), where the engine traced it."""
        return model

    def loss(self, output: Any, y: Tensor) -> Tensor:
        """The local training loss of the model's output: the task's (classification:
        cross-entropy)."""
        return self.task.loss(output, y)

    def logits(self, output: Any) -> Tensor:
        """The prediction scores in the model's output (FedROD: generic + personal)."""
        return output

    # -- server half ---------------------------------------------------------------------
    def init_server_state(self, weights: Tensor, num_clients: int) -> dict[str, Tensor]:
        return {}

    def payload(self, server_state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Extra tensors sent to every client with the weights (SCAFFOLD's c, say)."""
        return {}

    def server_update(
        self,
        weights: Tensor,
        agg: Aggregate,
        state: dict[str, Tensor],
        round: int,
        num_clients: int,
    ) -> ServerStep:
        """theta <- theta + eta_g * mean_i Delta_i (per unit, over the clients that trained it)."""
        new = weights + self.global_lr * agg.mean_delta()
        return ServerStep(new, new, state)

    # -- client half ---------------------------------------------------------------------
    def init_client_state(self, space: ParamSpace) -> dict[str, Tensor]:
        return {}

    def extra_loss(self, ctx: LocalCtx, loss: Tensor, features: Tensor | None) -> Tensor:
        return loss

    def adjust_grads(self, ctx: LocalCtx) -> None:
        """Add closed-form gradient terms to the trainable regions, before gradient clipping
        (so clipping sees them); nothing by default."""
        return None

    def adjust_grads_after_clipping(self, ctx: LocalCtx) -> None:
        """Add gradient terms that gradient clipping must not see, after it and before the
        optimiser step, as the optimiser's weight decay is (FedDyn's alpha_i theta under
        ``feddyn: {clip: loss}``); nothing by default. Called whether or not clipping is on."""
        return None

    def finish_client(self, ctx: LocalCtx, delta: Tensor) -> dict[str, Tensor]:
        """The client's new persistent state after local training (``ctx.unit_steps``: the
        steps each unit trained)."""
        return ctx.state

    def client_extras(
        self, ctx: LocalCtx, old: dict[str, Tensor], new: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Extra tensors the client sends (its state before and after the round given), which
        the server sums per key over the round's clients (SCAFFOLD's Delta c_i); none by
        default."""
        return {}


#: flags a hook implies: True exactly when the class overrides one of the hooks, and why it matters
IMPLIED_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "stateful_clients": (
        ("init_client_state", "finish_client"),
        "without it the state a client returns is dropped after every round",
    ),
    "needs_features": (("extra_loss",), "without it extra_loss is given features=None"),
}


def check_flags(cls: type[Algorithm]) -> None:
    """Set ``cls``'s computed flags from its hooks, and refuse (TypeError naming the class, the
    flag and the hook) a flag its class body sets against them or a declared flag without the
    hook it needs. Called when a subclass is defined, so before it can be registered."""
    who = cls.__qualname__
    for flag, (hooks, why) in IMPLIED_FLAGS.items():
        implied = cls.overrides(*hooks)
        if flag in vars(cls) and vars(cls)[flag] != implied:
            has = [h for h in hooks if cls.overrides(h)]
            which = f"overrides {has[0]}" if has else f"overrides none of {', '.join(hooks)}"
            raise TypeError(
                f"algorithm class {who} sets {flag} = {vars(cls)[flag]!r} but {which}: {flag} "
                f"is true exactly when a class overrides {' or '.join(hooks)} ({why}); remove "
                f"the {flag} line"
            )
        setattr(cls, flag, implied)
    if cls.extra_modules and not cls.overrides("wrap_model"):
        raise TypeError(
            f"algorithm class {who} sets extra_modules = {cls.extra_modules!r} but does not "
            "override wrap_model, the hook that adds those modules; override wrap_model or "
            "remove extra_modules"
        )
    if not cls.has_global_model and not cls.overrides("local_units"):
        raise TypeError(
            f"algorithm class {who} sets has_global_model = False but does not override "
            "local_units: every unit is then shared and the server's weights are the global "
            "model; override local_units (the units each client keeps) or remove the line"
        )


def build_algorithm(
    name: str, global_lr: float, blocks: dict[str, Any], task: Task | None = None
) -> Algorithm:
    """The algorithm ``name`` with its hyperparameter block from the config and its task."""
    cls = ALGORITHMS.get(name)
    params = blocks.get(name) if cls.params_cls else None
    alg = cls(global_lr=global_lr, params=params)
    if task is not None:
        alg.task = task
    return alg


def zeros_like_space(space: ParamSpace) -> Tensor:
    return torch.zeros(space.total, dtype=torch.float32)
