"""The client side: one function of (global weights, round config, client data, client state).

:func:`train_client` returns (update, metrics, new state) and reads everything from its
arguments, with all randomness drawn from a generator addressed by (seed, round, client), so any
executor (in-process, worker processes, Flower) runs the same code and gets the same numbers.
The model, optimiser buffers and FLOP counts it needs are built once per worker in a
:class:`ClientRuntime` and reused for every client.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, TypeVar

import torch
from torch import Tensor, nn

from fedbug.algorithms import Algorithm, ClientSession, LocalCtx
from fedbug.core.device import autocast, from_host, to_device
from fedbug.core.flops import (
    FlopCache,
    LossFn,
    StepCost,
    StepMemory,
    optimizer_state_copies,
    peak_memory,
)
from fedbug.core.optimizers import optimizer_entry
from fedbug.core.protocol import ClientData, ClientResult, ClientTask, TrainSettings
from fedbug.core.seeding import derive_seed, torch_generator
from fedbug.core.units import ParamSpace, unit_regions
from fedbug.data.augment import Augmentation
from fedbug.engine.privacy.sample_level import PerSampleGradients
from fedbug.policies import FreezePolicy, StepCtx
from fedbug.policies.base import EpochAction, EpochCtx, PolicySession

T = TypeVar("T")


class Draws(NamedTuple):
    """A step's batch as drawn (:meth:`LocalRound.batch_draws`): its sample indices and its
    augmentation's draws (None where the run does not augment)."""

    indices: Tensor
    augment: Tensor | None


__all__ = [
    "ClientData",
    "ClientResult",
    "ClientRuntime",
    "ClientTask",
    "EpochAction",
    "EpochCtx",
    "TrainSettings",
    "train_client",
]

PREPARED_BYTES = 256 * 2**20
"""A client's samples are prepared (normalised, laid out) once a round where they take at most
this many bytes prepared and no augmentation comes between; each step then gathers its rows."""


def to_channels_last(x: Tensor) -> Tensor:
    """A 4-D batch with NHWC strides (``memory_format: channels_last``); other tensors as they
    are. One channel gets the strides explicitly (``contiguous(channels_last)`` would keep it
    NCHW, which is equally "contiguous" there), so oneDNN still runs the layers after it NHWC."""
    if x.dim() != 4:
        return x
    if x.shape[1] == 1:
        n, _, h, w = x.shape
        return x.contiguous().as_strided(x.shape, (h * w, 1, w, 1))
    return x.contiguous(memory_format=torch.channels_last)


def with_memory_format(
    prepare: Callable[[Tensor], Tensor], memory_format: str
) -> Callable[[Tensor], Tensor]:
    """``prepare`` followed, for ``channels_last``, by an NHWC copy of 4-D batches. The weights
    stay contiguous (they are views into the flat vector): oneDNN takes the layout from the
    input, so convolutions and pooling then run in NHWC."""
    if memory_format != "channels_last":
        return prepare
    return functools.partial(_prepare_channels_last, prepare)


def _prepare_channels_last(prepare: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    return to_channels_last(prepare(x))


class ClientRuntime:
    """A reusable local model (weights bound to one flat vector), built once per worker."""

    def __init__(
        self,
        model: nn.Module,
        space: ParamSpace,
        policy: FreezePolicy,
        algorithm: Algorithm,
        settings: TrainSettings,
        prepare: Callable[[Tensor], Tensor],
        augment: Augmentation | None = None,
        classifier: str | None = None,
        *,
        device: torch.device | None = None,
        precision: str = "fp32",
    ) -> None:
        self.flop_model = copy.deepcopy(model)  # before hooks and binding: a plain copy (CPU)
        self.device = device if device is not None else torch.device("cpu")
        self.precision = precision
        self.model = model.to(self.device)
        self.space = space
        self.policy = policy
        self.algorithm = algorithm
        self.settings = settings
        self.prepare = prepare
        self.augment = augment
        self.flat = space.bind(model)
        layout = algorithm.layout  # None: a runtime built by hand, every unit the model's own
        self.extra_units: tuple[int, ...] = layout.extra if layout is not None else ()
        self.policy_units = layout.policy_units if layout is not None else space.num_units
        self.grad = torch.zeros(space.total, device=self.device)
        self.unit_params: list[list[tuple[nn.Parameter, Tensor]]] = [[] for _ in space.units]
        for name, off, n, shape, u in space.param_slots():
            p = model.get_parameter(name)
            self.unit_params[u].append((p, self.grad[off : off + n].view(shape)))
        self._features: Tensor | None = None
        if algorithm.needs_features:
            # the representation before the classifier: the input of the last layer the forward
            # pass calls (the engine passes its name; by default the last unit's last layer)
            head = model.get_submodule(classifier or space.units[-1].modules[-1])
            head.register_forward_pre_hook(self._capture)
        self.flop_count = FlopCache(self.flop_model, algorithm.loss)
        #: DP-SGD's per-sample gradients (a ``dp_sgd:`` block), None without
        self.private = (
            PerSampleGradients(model, settings.dp_sgd) if settings.dp_sgd is not None else None
        )
        #: whether a step's gradient must sit in the flat vector ``grad`` (an algorithm's terms,
        #: clipping and DP-SGD read or write it there); otherwise autograd's own gradient
        #: tensors are stepped on, which saves zeroing the views and adding into them
        self.flat_grads = (
            algorithm.overrides("adjust_grads", "adjust_grads_after_clipping")
            or bool(settings.clip_grad_norm)
            or self.private is not None
        )

    def _capture(self, _m: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        self._features = inputs[0]

    def set_trainable(self, units: tuple[int, ...]) -> list[slice]:
        """requires_grad and a gradient view on the given units, None elsewhere; their slices
        (one per run of consecutive units)."""
        if not units:
            raise ValueError("a freeze policy returned no trainable unit")
        on = set(units)
        for u, params in enumerate(self.unit_params):
            for p, g in params:
                p.requires_grad_(u in on)
                p.grad = g if u in on and self.flat_grads else None
        return unit_regions(units, self.space)

    def fresh_grads(self, units: tuple[int, ...]) -> None:
        """Before a backward pass without flat gradients: no gradient on the trainable
        parameters, so autograd hands its own tensors over instead of adding into views."""
        for u in units:
            for p, _ in self.unit_params[u]:
                p.grad = None

    def missing_grads(self, units: tuple[int, ...]) -> None:
        """After it: a trainable parameter autograd gave no gradient (unused by the forward
        pass) steps on zeros, as it does on its zeroed view with flat gradients."""
        for u in units:
            for p, g in self.unit_params[u]:
                if p.grad is None:
                    p.grad = g.zero_()

    def step_cost(
        self, units: tuple[int, ...] | range, x: Tensor, y: Tensor, loss: LossFn | None = None
    ) -> StepCost:
        """FLOPs and memory of one forward+backward with ``units`` trainable, counted once and
        cached (on the CPU copy of the model: the count does not depend on the device; the batch
        goes to the CPU only when a count is new, so a GPU step is not held up by a copy back)."""
        return self.flop_count.unit_cost(self.space.units, units, x, y, loss)

    def flops(
        self, units: tuple[int, ...] | range, x: Tensor, y: Tensor, loss: LossFn | None = None
    ) -> int:
        """The FLOPs of :meth:`step_cost`."""
        return self.step_cost(units, x, y, loss).flops

    def trainable_params(self, units: tuple[int, ...]) -> list[tuple[nn.Parameter, Tensor]]:
        """The parameters of ``units`` with their gradient views, in unit order."""
        return [pg for u in units for pg in self.unit_params[u]]

    @property
    def state_copies(self) -> int:
        """Copies of the trained parameters the optimiser keeps (momentum, Adam's moments)."""
        return optimizer_state_copies(self.settings.optimizer, self.settings.momentum)

    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        """The configured optimiser over the model (its entry in
        :data:`fedbug.core.optimizers.OPTIMIZERS`)."""
        s = self.settings
        return optimizer_entry(s.optimizer).make(list(self.model.parameters()), lr, s)


def train_client(
    weights: Tensor,
    task: ClientTask,
    data: ClientData,
    state: dict[str, Tensor],
    runtime: ClientRuntime,
) -> ClientResult:
    """Local training of one client for one round (FedBug Algorithm 3, lines 5-11).

    The algorithm's and the policy's per-client halves (:meth:`Algorithm.start_client`,
    :meth:`FreezePolicy.start_client`) are opened here and hold whatever this client needs; the
    result's typed fields come from this loop, then from the policy's and the algorithm's
    ``finish``. The steps are :class:`LocalRound`'s. A model's own draws from torch's global
    generator (dropout in a Hugging Face transformer) come from a stream seeded by (seed,
    round, client) too, so they repeat whatever ran before."""
    return trained_round(weights, task, data, state, runtime).result()


def trained_round(
    weights: Tensor,
    task: ClientTask,
    data: ClientData,
    state: dict[str, Tensor],
    runtime: ClientRuntime,
    keep_batches: bool = False,
) -> LocalRound:
    """The client's :class:`LocalRound`, trained (``keep_batches``: it keeps each step's sample
    indices, :attr:`LocalRound.drawn`)."""
    dev = runtime.device
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(derive_seed(task.seed, "model-draws", task.round, task.client))
        local = LocalRound(weights, task, data, state, runtime, keep_batches)
        local.train()
    return local


def trained_batches(
    weights: Tensor,
    task: ClientTask,
    data: ClientData,
    state: dict[str, Tensor],
    runtime: ClientRuntime,
) -> list[Tensor]:
    """Each local step's sample indices (into ``data``, on the CPU) in the pass whose update
    the client sends, from a replay of its round on ``runtime`` (``record_updates``' true
    inputs). Exact whatever draws between the batches: augmentation, an algorithm's own draws,
    DP-SGD's Poisson batches and noise, a policy's restart (the probe's batches are not kept)."""
    local = trained_round(weights, task, data, state, runtime, keep_batches=True)
    return [idx.cpu() for idx in local.drawn]


class LocalRound:
    """One client's local training in one round, in named steps: opened on the device
    (``__init__``), trained (:meth:`train`: a batch, the step's units, :meth:`step`, the policy's
    :meth:`end_of_epoch`), closed into a :class:`ClientResult` (:meth:`result`).

    The algorithm's :class:`LocalCtx` is built once, when the client opens; the regions it
    names follow the step's trainable units, and :meth:`result` views the whole vector."""

    def __init__(
        self,
        weights: Tensor,
        task: ClientTask,
        data: ClientData,
        state: dict[str, Tensor],
        runtime: ClientRuntime,
        keep_batches: bool = False,
        prepare: bool | None = None,
        received: Tensor | None = None,
    ) -> None:
        rt = self.rt = runtime
        dev = rt.device
        self.host = weights.device
        # on the device: the received weights (``received``, where the caller moved them there
        # once for several clients; never written), the client's state and the round's payload,
        # its data (augmented there: the draws alone are made on the host); moved without the
        # host waiting for the device's queue (``from_host``)
        self.received = received if received is not None else from_host(weights, dev)
        self.state = to_device(state, dev)
        if task.payload is not None:
            task = dataclasses.replace(task, payload=to_device(task.payload, dev))
        self.task = task
        self.xs, self.ys = from_host(data.x, dev), from_host(data.y, dev)
        #: the samples prepared once for the round: a step's batch is then its rows (the
        #: preparation is elementwise, and indexing keeps the NHWC layout: the same numbers as
        #: a batch prepared at its step, without normalising each sample every epoch again);
        #: ``prepare`` decides instead of the samples' size (the cohort executor's clients
        #: prepare once all or none)
        once = prepares_once(prepared_bytes(self.xs, rt), rt) if prepare is None else prepare
        self.prepared = once and rt.augment is None
        if self.prepared:
            self.xs = rt.prepare(self.xs)
        rt.model.train()
        rt.flat.copy_(self.received)
        load_local_parts(rt.flat, self.state, rt.space)
        self.n = len(data)
        self.gen = shuffle_generator(task.seed, task.round, task.client)
        # DP-SGD's batch draws and noise: a stream of their own, so the rest draws as without
        self.dp_gen = (
            torch_generator(task.seed, "dp-sgd", task.round, task.client)
            if rt.private is not None
            else None
        )
        self.scaler = torch.amp.GradScaler(dev.type) if rt.precision == "fp16" else None
        self.session = rt.algorithm.start_client(task, data.y, rt, self.gen)
        self.policy = rt.policy.start_client(task)
        self.local_steps, self.per_epoch = self.session.local_step_count(self.n, rt.settings)
        self.ctx = LocalCtx(
            space=rt.space,
            weights=rt.flat,
            grads=rt.grad,
            received=self.received,
            regions=[],
            state=self.state,
            num_samples=self.n,
            mean_samples=task.mean_samples,
            payload=task.payload,
            lr=task.lr,
        )
        self.loss_sum = torch.zeros((), device=dev)
        self.idle = self.flops = self.probe_steps = self.probe_flops = 0
        self.peak: StepMemory | None = None  # the costliest step's memory (counted with FLOPs)
        self.shuffle = ShuffledBatches(self.n, rt.settings.batch_size, self.per_epoch, self.gen)
        #: each local step's sample indices since the round last (re)started, where kept
        self.keep_batches = keep_batches
        self.drawn: list[Tensor] = []
        #: whether the step last yielded ends an epoch (the policy's answer comes next), and
        #: how many times the round started over: what the cohort executor synchronises on
        self.epoch_ends = False
        self.restarts = 0
        self.begin()

    def begin(self) -> None:
        """A fresh optimiser and no unit trained yet (at the start, and when a policy restarts
        the round)."""
        m = self.rt.space.num_units
        self.opt = self.rt.make_optimizer(self.task.lr)
        self.trained = [False] * m
        self.unit_steps = [0] * m
        self.current: tuple[int, ...] | None = None
        self.drawn = []

    def train(self) -> None:
        """The local steps, one :meth:`step` each."""
        for units, x, y in self.steps():
            self.step(units, x, y)

    def steps(self) -> Iterator[tuple[tuple[int, ...], Tensor, Tensor]]:
        """Each local step's (units, batch, labels), to be trained before the next is asked
        for (:meth:`plan` with each step's :meth:`batch`)."""
        for units, (x, y) in self.plan(self.batch):
            yield units, x, y

    def plan(self, draw: Callable[[int], T]) -> Iterator[tuple[tuple[int, ...], T]]:
        """Each local step's units and ``draw(k)``, its batch (:meth:`batch`) or what it is
        drawn from (:meth:`batch_draws`: the cohort executor gathers a group's batches at
        once), to be trained before the next is asked for; ``draw`` runs at every step, idle
        ones too, in order. A step the policy and the algorithm leave nothing to train is idle
        (counted, not yielded), and a policy's end-of-epoch answer may send ``k`` back to 0
        (a restart)."""
        rt, task = self.rt, self.task
        k = 0
        while k < self.local_steps:
            k += 1
            drawn = draw(k)
            step = StepCtx(
                k, self.local_steps, rt.policy_units, task.round, task.client, task.rounds
            )
            units = step_units(self.policy, self.session, step, self.per_epoch, rt.extra_units)
            if not units:
                self.idle += 1
                continue
            self.epoch_ends = k % self.per_epoch == 0 and k < self.local_steps
            yield units, drawn
            if self.epoch_ends:
                k = self.end_of_epoch(k)

    def batch_indices(self, k: int) -> Tensor:
        """Step ``k``'s sample indices, drawn as step ``k`` comes (in order): DP-SGD's Poisson
        draw from its own generator, or a slice of the epoch's shuffle (:class:`ShuffledBatches`,
        drawn on the CPU, moved once an epoch); kept in :attr:`drawn` where asked."""
        rt = self.rt
        if rt.private is not None and rt.private.poisson:
            assert self.dp_gen is not None
            idx = rt.private.poisson_batch(self.n, rt.settings.batch_size, self.dp_gen)
        else:
            idx = self.shuffle.indices(k, self.xs.device)
        idx = from_host(idx, self.xs.device)  # a Poisson draw, made on the host: no wait
        if self.keep_batches:
            self.drawn.append(idx)
        return idx

    def batch_draws(self, k: int) -> Draws:
        """What step ``k``'s batch is made of: its :meth:`batch_indices`, then its
        augmentation's draws from the client's generator, in that order and at every step,
        idle ones too (:meth:`plan` calls it so): the sequential executor's :meth:`batch` and
        the cohort executor's plan draw alike."""
        idx = self.batch_indices(k)
        aug = self.rt.augment
        return Draws(idx, aug.draw(len(idx), self.gen) if aug is not None else None)

    def batch(self, k: int) -> tuple[Tensor, Tensor]:
        """Step ``k``'s batch: its :meth:`batch_draws`' samples, augmented on their device,
        then prepared."""
        rt = self.rt
        idx, draws = self.batch_draws(k)
        x, y = self.xs[idx], self.ys[idx]  # a client's samples and labels live on one device
        if rt.augment is not None and draws is not None:
            x = rt.augment.apply(x, draws)
        return (x if self.prepared else rt.prepare(x)), y

    def step(self, units: tuple[int, ...], x: Tensor, y: Tensor) -> None:
        """One optimiser step on ``units``: the loss and the algorithm's terms, backward, the
        closed-form gradient terms, clipping, the step (fp16: through the grad scaler)."""
        rt, alg, ctx, session, scaler = (
            self.rt,
            self.rt.algorithm,
            self.ctx,
            self.session,
            self.scaler,
        )
        self.mark(units)
        session.before_step(x, y)
        if rt.flat_grads:
            for r in ctx.regions:
                rt.grad[r].zero_()
        else:
            rt.fresh_grads(units)
        if len(y):  # (a DP-SGD Poisson draw can be empty: the step is then its noise alone)
            self.backward(x, y)
        if not rt.flat_grads:
            rt.missing_grads(units)
        if rt.private is not None:
            assert self.dp_gen is not None
            # over the expected batch q n = min(B, n) (q = min(1, B / n)), as Opacus divides
            expected = min(rt.settings.batch_size, self.n)
            rt.private.privatize(rt.trainable_params(units), expected, self.dp_gen, units)
        alg.adjust_grads(ctx)
        if rt.settings.clip_grad_norm:
            clip_grad_norm(rt.grad, ctx.regions, rt.settings.clip_grad_norm)
        alg.adjust_grads_after_clipping(ctx)
        if scaler is not None:
            scaler.step(self.opt)  # skipped where fp16 overflowed
            scaler.update()
        else:
            self.opt.step()
        session.after_step()
        self.count(units, x, y)

    def mark(self, units: tuple[int, ...]) -> None:
        """A step on ``units``: the runtime's trainable units (when they change), the units
        trained and each one's step count."""
        if units != self.current:
            self.current = units
            self.ctx.regions = self.rt.set_trainable(units)
            for u in units:
                self.trained[u] = True
        for u in units:
            self.unit_steps[u] += 1

    def count(self, units: tuple[int, ...], x: Tensor, y: Tensor) -> None:
        """The step's FLOPs and memory (where counted)."""
        self.charge(self.cost(units, x, y), len(y))

    def cost(self, units: tuple[int, ...], x: Tensor, y: Tensor) -> StepCost | None:
        """A step's counted cost on this batch (None where nothing is counted): the same for
        every client's batch of one shape and loss (the cohort executor counts a group once)."""
        rt = self.rt
        if rt.settings.count_flops and len(y):
            return rt.step_cost(units, x, y, self.session.loss)
        return None

    def charge(self, cost: StepCost | None, batch: int) -> None:
        """Add a step's :meth:`cost` (of ``batch`` samples) to the round's FLOPs and peak."""
        if cost is not None:
            rt = self.rt
            self.flops += cost.flops
            per_sample = batch if rt.private is not None else 0
            self.peak = peak_memory(self.peak, cost.memory(rt.state_copies, per_sample))

    def backward(self, x: Tensor, y: Tensor) -> None:
        """The step's loss (with the algorithm's terms) and its backward pass (fp16: scaled,
        then unscaled, so the algorithm's terms and clipping see true gradients)."""
        rt, session, scaler = self.rt, self.session, self.scaler
        if rt.private is not None:
            rt.private.clear()
        with autocast(rt.device, rt.precision):
            loss = session.loss(rt.model(x), y)
            self.loss_sum += loss.detach().float()
            loss = rt.algorithm.extra_loss(self.ctx, loss, rt._features)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(self.opt)
        elif rt.private is not None:
            rt.private.backward(loss)
        else:
            loss.backward()

    def end_of_epoch(self, k: int) -> int:
        """The policy's answer after an epoch that is not the last: restore units to the received
        weights (optimiser state kept), or start the round over (the probe is not kept: ``k``
        goes back to 0). Returns the step count to go on from."""
        rt, space, pe = self.rt, self.rt.space, self.per_epoch
        ctx = EpochCtx(k // pe, self.local_steps // pe, self.task, space, rt.flat, self.received)
        action = self.policy.end_of_epoch(ctx)
        if action is None:
            return k
        if action.restart:
            self.restarts += 1
            self.probe_steps += k
            self.probe_flops = self.flops
            rt.flat.copy_(self.received)
            load_local_parts(rt.flat, self.state, space)
            self.begin()
            return 0
        for u in action.restore:
            rt.flat[space.unit_slices[u]] = self.received[space.unit_slices[u]]
            self.trained[u] = False
            self.unit_steps[u] = 0
        self.current = None
        return k

    def result(self) -> ClientResult:
        """The update, the new client state and the costs; then the policy's and the
        algorithm's ``finish``; back on the host."""
        rt, alg, space = self.rt, self.rt.algorithm, self.rt.space
        rt._features = None
        delta = rt.flat - self.received
        whole = dataclasses.replace(
            self.ctx, regions=[slice(0, space.total)], unit_steps=self.unit_steps
        )
        finished = alg.finish_client(whole, delta)
        extras = alg.client_extras(whole, self.state, finished)
        full = rt.settings.upload == "full"
        shared = alg.shared_mask(space.num_units)
        uploaded = [s and (t or full) for t, s in zip(self.trained, shared)]
        result = ClientResult(
            client=self.task.client,
            num_samples=self.n,
            delta=delta,
            trained=self.trained,
            state=save_local_parts(finished, rt.flat, alg, space),
            train_loss=float(self.loss_sum)
            / max(1, self.local_steps + self.probe_steps - self.idle),
            steps=self.local_steps,
            flops=self.flops,
            probe_flops=self.probe_flops,
            probe_steps=self.probe_steps,
            trained_params=sum(c for c, t in zip(space.unit_param_numel, self.trained) if t),
            bytes_up=space.bytes_of(uploaded),
            extras=extras,
            uploaded=uploaded,
        )
        result.set_peak_mem(self.peak)
        self.policy.finish(result)
        self.session.finish(result)
        return to_host(result, self.host) if rt.device != self.host else result


def clip_grad_norm(grad: Tensor, regions: list[slice], max_norm: float) -> None:
    """Scale the gradient of the trainable regions to norm at most ``max_norm`` (their joint
    norm), in place, over the last axis: one client's flat vector, or each row of the cohort
    executor's stacked ones."""
    norm = torch.stack([grad[..., r].norm(dim=-1) for r in regions], dim=-1).norm(dim=-1)
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0).unsqueeze(-1)
    for r in regions:
        grad[..., r].mul_(scale)


def prepares_once(nbytes: int, rt: ClientRuntime) -> bool:
    """Whether a client whose samples take ``nbytes`` prepared has them prepared once a round
    (nothing augmented between, and at most :data:`PREPARED_BYTES`)."""
    return rt.augment is None and nbytes <= PREPARED_BYTES


def prepared_bytes(xs: Tensor, rt: ClientRuntime) -> int:
    """The bytes of ``xs`` once prepared (the model's input type: float32 images, int64
    tokens), from one sample's."""
    if not len(xs):
        return 0
    one = rt.prepare(xs[:1])
    return one.numel() * one.element_size() * len(xs)


def to_host(result: ClientResult, host: torch.device) -> ClientResult:
    """What is aggregated or stored, moved back to the host."""
    return dataclasses.replace(
        result,
        delta=result.delta.to(host),
        state=to_device(result.state, host),
        extras=to_device(result.extras, host),
        entries=to_device(result.entries, host),
    )


def shuffle_generator(seed: int, round: int, client: int) -> torch.Generator:
    """The generator a client's local round draws its epochs' permutations from (augmentation
    and an algorithm's own draws come from it too, between them)."""
    return torch_generator(seed, "client", round, client)


class ShuffledBatches:
    """The usual batches of shuffled epochs: at an epoch's first step a permutation of the
    ``n`` samples drawn from ``gen``, step ``k``'s batch its slice ``pos B : (pos + 1) B``
    (``pos = (k - 1) mod per_epoch``; an epoch's last batch may be short). The one rule the
    client's :meth:`LocalRound.batch_indices` draws by, and the attack's ``--known-order``
    replays from the run's seed (exact where nothing else draws from ``gen`` between epochs)."""

    def __init__(self, n: int, batch_size: int, per_epoch: int, gen: torch.Generator) -> None:
        self.n, self.batch_size, self.per_epoch, self.gen = n, batch_size, per_epoch, gen
        self.perm = torch.empty(0, dtype=torch.long)

    def indices(self, k: int, device: torch.device | None = None) -> Tensor:
        """Step ``k``'s (1-based, asked in order) indices; a new epoch's draw moved to
        ``device``."""
        bs, pos = self.batch_size, (k - 1) % self.per_epoch
        if pos == 0:
            perm = torch.randperm(self.n, generator=self.gen)
            self.perm = perm if device is None else from_host(perm, device)
        return self.perm[pos * bs : (pos + 1) * bs]


def first_drawn(steps: Sequence[Tensor]) -> Tensor:
    """Each sample the steps' batches hold, once, in the order first drawn: what
    ``record_updates`` keeps as a client's true inputs, whose rows the attack's
    ``--known-order`` maps each step's batch to."""
    order = list(dict.fromkeys(torch.cat(list(steps)).tolist())) if steps else []
    return torch.tensor(order, dtype=torch.long)


def step_units(
    policy: PolicySession,
    session: ClientSession,
    step: StepCtx,
    per_epoch: int,
    extra_units: tuple[int, ...] = (),
) -> tuple[int, ...]:
    """The units that train at a local step: the freeze policy's (it sees the model's own
    units, ``step.num_units`` of them) and the units an algorithm adds (FedROD's personal head,
    traced last: the algorithm's to freeze), less those the algorithm does not allow."""
    units = tuple(policy.trainable_units(step)) + extra_units
    allowed = session.allowed_units(step.step, step.local_steps, per_epoch)
    if allowed is None:
        return units
    keep = set(allowed)
    return tuple(u for u in units if u in keep)


def load_local_parts(flat: Tensor, state: dict[str, Tensor], space: ParamSpace) -> None:
    """Overwrite the client's own units (``local.<unit>`` in its state) in ``flat``."""
    for key, value in state.items():
        if key.startswith("local."):
            flat[space.unit_slices[int(key[6:])]] = value


def save_local_parts(
    state: dict[str, Tensor], flat: Tensor, alg: Algorithm, space: ParamSpace
) -> dict[str, Tensor]:
    """The state with the algorithm's local units' current values as ``local.<unit>``."""
    local = alg.local_units(space.num_units)
    if not local:
        return state
    out = dict(state)
    for u in local:
        out[f"local.{u}"] = flat[space.unit_slices[u]].clone()
    return out
