"""``executor: cohort``: a round's clients trained together, one vectorised step for all.

Each client's round is planned by the same :class:`~fedbug.engine.client.LocalRound` the
sequential executor runs (its batches' samples from the client's own generator, its units from
the policy and the algorithm, its bookkeeping, its result); only the arithmetic of a step is
shared, and the reading of its batches (a chunk holds its clients' samples in one tensor, and a
group's batches are one gather: :class:`Samples`).
At each step the clients whose step has the same trainable units and batch shape form a group,
and the group's gradients come from one ``torch.func.vmap`` of ``grad`` over
``functional_call`` with the clients' weights stacked along a leading axis (gradients only for
the units that train: a frozen unit costs no backward below it); under ``cohort.gradient:
streams`` each client's own gradient instead, the clients side by side on CUDA streams
(:mod:`fedbug.engine.executors.streams`: the sequential step's kernels, its numbers on a GPU
too, and faster than the grouped kernels in CUDA graphs). SGD then moves every client of
the group at once, exactly as ``torch.optim.SGD`` (or Adam) moves one (weight decay on the
trained parameters, momentum buffers and Adam's moments begun at a parameter's first step,
per-client gradient clipping over the trained units). Clients whose rounds are longer simply
go on alone.

The numbers are the sequential executor's within float32 rounding (a batched kernel sums in
another order), not bit for bit: ``tests/test_cohort.py`` holds every accepted family to 1e-4 of
each unit's change. What cannot be vectorised is refused before the run
(:mod:`fedbug.config.cohort`; the model's buffers and dropout here).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedbug.algorithms import LocalCtx
from fedbug.core.device import dense_strides, from_host
from fedbug.core.optimizers import StackedOptimizer, optimizer_entry
from fedbug.core.protocol import ClientData, ClientResult, ClientTask
from fedbug.core.units import ParamSpace
from fedbug.engine.client import (
    ClientRuntime,
    Draws,
    LocalRound,
    clip_grad_norm,
    prepared_bytes,
    prepares_once,
    unit_regions,
)
from fedbug.engine.executors.base import Executor
from fedbug.engine.executors.graphs import ALIGN, GraphCache
from fedbug.engine.executors.streams import Lanes
from fedbug.errors import ConfigError, first_line

#: a client's step: its units and its batch as drawn (its sample indices, in the chunk's
#: :class:`Samples` less the client's offset there, and its augmentation's draws)
Step = tuple[tuple[int, ...], Draws]


def refuse_model(model: nn.Module, space: ParamSpace) -> None:
    """One-line refusals of what a vectorised step cannot reproduce: state a forward pass
    changes (BatchNorm's running statistics), random draws inside the model."""
    fix = "or use executor: sequential"
    buffers = [n for n, is_param in zip(space.names, space.is_param) if not is_param]
    if buffers:
        raise ConfigError(
            f"executor: cohort cannot update buffers inside a vectorised step ({buffers[0]}, "
            f"...: BatchNorm's running statistics); use a GroupNorm model {fix}"
        )
    drop = [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
    ]
    if drop:
        first = drop[0]  # the first that draws masks, not a dropout of rate 0 before it
        raise ConfigError(
            f"executor: cohort cannot draw the sequential executor's dropout masks ({first}); "
            f"set the dropout to 0 {fix}"
        )


class CohortExecutor(Executor):
    """The round's clients in chunks of ``max_clients`` (or as many as ``memory_mb`` holds),
    each chunk trained together."""

    def __init__(
        self,
        runtime: ClientRuntime,
        client_data: Callable[[int], ClientData],
        max_clients: int | None = None,
        memory_mb: float | None = None,
        sizes: Callable[[int], int] | None = None,
        graphs: GraphCache | None = None,
        lanes: Lanes | None = None,
    ) -> None:
        self.rt = runtime
        #: the vectorised gradients' CUDA graphs (``cohort.cuda_graphs``); None: eager
        self.graphs = graphs
        #: ``cohort.gradient: streams``: each client's own gradient, clients on these streams;
        #: None: one vmap over the clients
        self.lanes = lanes
        #: a client's number of samples (default: its data's length, read through client_data)
        self.sizes = sizes or (lambda c: len(client_data(c)))
        self._sample_bytes: int | None = None
        self._raw_bytes = 0  # one sample's, as the data set keeps it (counted with the above)
        self.client_data = client_data
        self.max_clients = max_clients
        self.memory_mb = memory_mb
        self.space = runtime.space
        self.params = self.space.param_slots()
        self._client_bytes: int | None = None  # one client's share of a chunk, counted once
        #: under ``cuda_graphs``, where a group's gradients are written (:meth:`out`)
        self._out: Tensor | None = None

    def stream_round(
        self, weights: Tensor, tasks: list[ClientTask], states: Mapping[int, dict[str, Tensor]]
    ) -> Iterator[ClientResult]:
        ordered = sorted(tasks, key=lambda t: t.client)
        size = self.chunk_size(ordered)
        for i in range(0, len(ordered), size):
            yield from self.train_chunk(weights, ordered[i : i + size], states)

    def chunk_size(self, tasks: list[ClientTask]) -> int:
        """Clients a chunk takes: ``max_clients``, at most what ``memory_mb`` holds, at least 1."""
        size = self.max_clients or len(tasks) or 1
        if self.memory_mb is not None and tasks:
            if self._client_bytes is None:  # a full batch of any client: the same every round
                self._client_bytes = self.client_bytes(tasks[0])
            share = self._client_bytes + self.sample_bytes(tasks)
            size = min(size, max(1, int(self.memory_mb * 2**20 // share)))
        return size

    def client_bytes(self, task: ClientTask) -> int:
        """Bytes one client of a chunk takes besides its samples (:meth:`sample_bytes`): a full
        step's memory as the library counts it (activations saved for backward, gradients) on a
        full batch, and its rows of the stacked vectors: the chunk's (weights, received weights,
        optimiser state, its state) and a group step's (the gradient; the gathered weights,
        received weights and state where its rows are not consecutive and cannot be views)."""
        rt = self.rt
        data = self.client_data(task.client)
        # a full batch even where this client holds fewer samples (the chunk's others may not)
        idx = (torch.arange(rt.settings.batch_size) % max(1, len(data))).to(data.x.device)
        x, y = rt.prepare(data.x[idx].to(rt.device)), data.y[idx].to(rt.device)
        step = rt.step_cost(range(self.space.num_units), x, y)
        # chunk: weights, received; group step: gathered weights, gradient, gathered received
        rows = 5 + rt.state_copies
        state = rt.algorithm.init_client_state(self.space)  # in the chunk and gathered per step
        state_bytes = 2 * sum(v.numel() * v.element_size() for v in state.values())
        return step.activations + step.trained + 4 * self.space.total * rows + state_bytes

    def sample_bytes(self, tasks: list[ClientTask]) -> int:
        """The most bytes a client of ``tasks`` holds of samples in a chunk: prepared for the
        round where they fit (:data:`~fedbug.engine.client.PREPARED_BYTES`: normalised once a
        round, nothing augmented), else as the data set keeps them (each batch augmented and
        prepared at its step)."""
        if not tasks:
            return 0
        one = self.one_sample_bytes(tasks[0])
        held = (self.sizes(t.client) for t in tasks)
        return max(
            n * one if prepares_once(n * one, self.rt) else n * self._raw_bytes for n in held
        )

    def one_sample_bytes(self, task: ClientTask) -> int:
        """One sample's bytes, prepared: the same for every client (counted once, from
        ``task``'s client; 0, and counted again at the next call, while it holds none)."""
        if self._sample_bytes is None:
            one = self.client_data(task.client).x[:1]
            if not len(one):
                return 0
            self._sample_bytes = prepared_bytes(one, self.rt)
            self._raw_bytes = one.numel() * one.element_size()
        return self._sample_bytes

    def train_chunk(
        self, weights: Tensor, tasks: list[ClientTask], states: Mapping[int, dict[str, Tensor]]
    ) -> list[ClientResult]:
        rt = self.rt
        chunk = self.open_chunk(weights, tasks, states)
        if self.graphs is not None:  # the graphs' gradient buffer, as wide as the chunk at once
            self.out(len(tasks))
        rounds = chunk.rounds
        plans = [r.plan(r.batch_draws) for r in rounds]
        active = list(range(len(rounds)))
        while active:
            pending: dict[tuple[Any, ...], list[tuple[int, Step]]] = defaultdict(list)
            for c in active:
                step = self.next_step(c, plans[c], chunk)
                if step is not None:  # a group: the same units, batches of one size
                    pending[step[0], len(step[1].indices)].append((c, step))
            active = [c for group in pending.values() for c, _ in group]
            for group in pending.values():
                self.group_step([c for c, _ in group], [s for _, s in group], chunk)
        # each client's task losses, read from the device at once
        sums = (torch.stack([r.loss_sum for r in rounds]) + chunk.loss_sums).cpu()
        results = []
        for c, local in enumerate(rounds):
            local.loss_sum = sums[c]
            rt.flat.copy_(chunk.opt.weights[c])
            results.append(local.result())
        return results

    def open_chunk(
        self, weights: Tensor, tasks: list[ClientTask], states: Mapping[int, dict[str, Tensor]]
    ) -> Chunk:
        """The chunk's clients, each opened as it would be alone (received weights, its local
        parts), their samples moved into one :class:`Samples` as each opens (prepared once
        for the round where every client's are, else none), their weights stacked."""
        rt = self.rt
        sizes = [self.sizes(t.client) for t in tasks]
        one = self.one_sample_bytes(tasks[0])
        once = all(prepares_once(n * one, rt) for n in sizes)
        samples = Samples(sizes, prepared=once)
        rounds: list[LocalRound] = []
        rows = aligned_rows(len(tasks), rt.flat)
        received = from_host(weights, rt.device)  # once for the chunk's clients
        for t in tasks:
            data = self.client_data(t.client)
            state = states[t.client]
            local = LocalRound(weights, t, data, state, rt, prepare=once, received=received)
            samples.adopt(len(rounds), local)
            rows[len(rounds)].copy_(rt.flat)
            rounds.append(local)
        stacked = optimizer_entry(rt.settings.optimizer).stacked
        opt = stacked(rows, rt.settings, tasks[0].lr, self.space.num_units)
        return Chunk(rounds, opt, samples)

    def next_step(self, c: int, plan: Iterator[Step], chunk: Chunk) -> Step | None:
        """Client ``c``'s next step. After a step that ended an epoch the policy answers first
        (FreezeFL's probe: restore units, or start over), on the runtime's flat vector: the
        client's row goes there and back, and a restart clears its optimiser state."""
        local, opt, rt = chunk.rounds[c], chunk.opt, self.rt
        if not local.epoch_ends:
            return next(plan, None)
        rt.flat.copy_(opt.weights[c])
        restarts = local.restarts
        step = next(plan, None)
        opt.weights[c].copy_(rt.flat)
        if local.restarts != restarts:
            opt.reset(c)
        return step

    def group_step(self, clients: list[int], steps: list[Step], chunk: Chunk) -> None:
        """One step of clients that train the same units on batches of one size."""
        units, rounds, opt = steps[0][0], chunk.rounds, chunk.opt
        rows = chunk.rows(clients)
        x, y = chunk.samples.batches(rows, [s[1] for s in steps], self.rt)
        for c in clients:
            rounds[c].mark(units)
        lead = rounds[clients[0]]
        ctx = chunk.ctx(self.space, rows.take(opt.weights), rows, units, lead)
        losses = self.gradients(units, x, y, ctx, lead.session.loss)
        rt = self.rt
        rt.algorithm.adjust_grads(ctx)  # the algorithm's terms, written for stacked clients
        if rt.settings.clip_grad_norm:  # each client's gradient, as the sequential step clips
            clip_grad_norm(ctx.grads, ctx.regions, rt.settings.clip_grad_norm)
        rt.algorithm.adjust_grads_after_clipping(ctx)
        opt.step(rows, ctx.grads, units, self.space)
        rows.add(chunk.loss_sums, losses)
        cost = lead.cost(units, x[0], y[0])  # one batch shape and loss a group
        for c in clients:
            rounds[c].charge(cost, y.shape[1])

    def gradients(
        self, units: Sequence[int], x: Tensor, y: Tensor, ctx: LocalCtx, loss: Any
    ) -> Tensor:
        """Set ``ctx.grads`` to the gradients of each client's loss with the algorithm's term
        (``extra_loss``, run inside the vectorised map for one client, with that client's
        features), stacked flat vectors zero outside ``units``; return each client's task
        loss, as the sequential step records it. Under ``cuda_graphs`` the map is replayed
        from a graph captured for the group's units, number of clients and batch shapes (its
        gradient then in :meth:`out`, shared by every graph, and its losses in the graph's
        output: both rewritten by the next replay, and read by the step before)."""
        on, w = set(units), ctx.weights
        try:
            if self.graphs is None:
                g, value = self.gradient_fn(on, ctx, loss)(w, x, y)
            else:  # the context without tensors: a graph would keep the capture's
                fn = self.gradient_fn(on, tensorless(ctx), loss, self.out(len(w)))
                g, value = self.graphs(tuple(units), fn, w, x, y)  # and the inputs' layout
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:  # an impure loss or model: in-place updates, .item(), draws
            raise ConfigError(
                f"executor: cohort maps the loss and the model over the clients with "
                f"torch.func.{'vmap' if self.lanes is None else 'grad'}"
                f"{' in a CUDA graph' if self.graphs else ''}, which refused "
                f"them ({first_line(e)[:200]}); make the loss a pure function of the output and "
                "labels (no in-place updates of captured tensors, no .item()), or use executor: "
                "sequential"
            ) from e
        finally:
            self.rt._features = None  # the hook's capture lived inside the map
        ctx.grads = g
        return value.detach()

    def out(self, clients: int) -> Tensor:
        """Where the gradients of a group of ``clients`` are written under ``cuda_graphs``: the
        first rows of one ``[clients, total]`` tensor shared by every graph (made anew only for
        a larger group, the graphs then dropped: they write into the old one). A graph's own
        output would stay in the graphs' memory pool as long as the graph: a whole gradient
        for each unit set and batch shape (under gradual unfreezing, one a stage); each is
        read before the next replay, so one serves all."""
        if self._out is None or len(self._out) < clients:
            if self.graphs is not None:  # those captured on the narrower one write there
                self.graphs.clear()
            flat = self.rt.flat
            self._out = torch.empty(clients, flat.numel(), dtype=flat.dtype, device=flat.device)
        return self._out[:clients]

    def gradient_fn(
        self, on: set[int], ctx: LocalCtx, loss: Any, out: Tensor | None = None
    ) -> Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
        """The group's gradients as a pure function of its stacked weights, batches and labels:
        the clients' stacked flat gradients (:meth:`flatten`, into ``out`` where given) and
        each client's task loss. It reads nothing else that changes between steps (what a
        graph needs)."""
        rt, params = self.rt, self.params
        model, alg = rt.model, rt.algorithm

        def client_loss(tr: dict[str, Tensor], fx: dict[str, Tensor], xb: Tensor, yb: Tensor):
            base = loss(functional_call(model, {**tr, **fx}, (xb,)), yb)
            return alg.extra_loss(ctx, base, rt._features), base

        one_client = grad_and_value(client_loss, has_aux=True)
        names = [n for n, _o, _k, _s, u in params if u in on]

        def fn(w: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
            trained = {n: w[:, o : o + k].view(-1, *s) for n, o, k, s, u in params if u in on}
            fixed = {n: w[:, o : o + k].view(-1, *s) for n, o, k, s, u in params if u not in on}
            g, (_, value) = vmap(one_client)(trained, fixed, x, y)
            return self.flatten(g, len(w), out), value.detach()

        lanes = self.lanes
        if lanes is None:
            return fn

        def on_streams(w: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
            def client(i: int) -> tuple[dict[str, Tensor], Tensor]:
                row = {n: w[i, o : o + k].view(s) for n, o, k, s, _ in params}
                trained = {n: row.pop(n) for n in names}
                g, (_, value) = one_client(trained, row, x[i], y[i])
                return g, value.detach()

            each = lanes.map(client, len(w))
            values = torch.stack([v for _, v in each])
            g = {n: torch.stack([g[n] for g, _ in each]) for n in names}
            return self.flatten(g, len(w), out), values

        return on_streams

    def flatten(self, g: Mapping[str, Tensor], clients: int, out: Tensor | None = None) -> Tensor:
        """The stacked flat gradients (``clients`` rows) of the parameters ``g`` names, zero
        elsewhere: one concatenation (with a zero block a run of the others; into ``out`` where
        given), inside a graph where the gradient is captured, instead of a copy a parameter
        after its replay."""
        pieces: list[Tensor] = []
        zeros, end = 0, 0  # a run of entries not in g, and where the pieces reach
        for n, o, k, _s, _u in self.params:
            zeros += o - end
            end = o + k
            if n not in g:
                zeros += k
                continue
            if zeros:
                pieces.append(g[n].new_zeros(clients, zeros))
                zeros = 0
            pieces.append(g[n].reshape(clients, k))
        zeros += self.space.total - end
        if zeros or not pieces:
            pieces.append(torch.zeros(clients, zeros, device=self.rt.device))
        return torch.cat(pieces, dim=1) if out is None else torch.cat(pieces, dim=1, out=out)


def tensorless(ctx: LocalCtx) -> LocalCtx:
    """``ctx`` with empty tensors where it had the group's (what a graph's ``extra_loss`` sees:
    a tensor of the capture's step would be freed, or stale, by a later replay)."""
    none = torch.empty(0, device=ctx.weights.device)
    return dataclasses.replace(
        ctx, weights=none, grads=none, received=none, state={}, num_samples=none, payload={}
    )


class Chunk:
    """The clients trained together: their rounds, the optimiser over their stacked weights, and
    what their steps read, stacked once (received weights, states, sample counts, samples)."""

    def __init__(self, rounds: list[LocalRound], opt: StackedOptimizer, samples: Samples) -> None:
        self.rounds, self.opt, self.samples = rounds, opt, samples
        dev = opt.weights.device
        self.received = torch.stack([r.received for r in rounds])
        keys = rounds[0].state.keys() if rounds else ()
        self.state = {k: torch.stack([r.state[k] for r in rounds]) for k in keys}
        self.num_samples = from_host(torch.tensor([[float(r.n)] for r in rounds]), dev)
        #: each client's task losses summed over its steps (one addition a group step)
        self.loss_sums = torch.zeros(len(rounds), device=dev)
        self.no_grads = torch.empty(0, device=dev)  # a group's, until its gradient is set
        self._rows: dict[tuple[int, ...], Rows] = {}

    def rows(self, clients: list[int]) -> Rows:
        """The rows of ``clients``, made once per set of clients (a copy to the device each
        step would cost a transfer)."""
        key = tuple(clients)
        if key not in self._rows:
            self._rows[key] = Rows.of(clients, self.opt.weights.device)
        return self._rows[key]

    def ctx(
        self,
        space: ParamSpace,
        w: Tensor,
        rows: Rows,
        units: Sequence[int],
        lead: LocalRound,
    ) -> LocalCtx:
        """A group's :class:`LocalCtx`, its tensors stacked over the clients (``rows``; the
        gradient empty until :meth:`CohortExecutor.gradients` sets it); the round-wide settings
        from ``lead``, the group's first client (passed as an object: the row read back from
        the device would wait for the GPU every step)."""
        first = lead.task
        return LocalCtx(
            space=space,
            weights=w,
            grads=self.no_grads,
            received=rows.take(self.received),
            regions=unit_regions(units, space),
            state={k: rows.take(v) for k, v in self.state.items()},
            num_samples=rows.take(self.num_samples),
            mean_samples=first.mean_samples,
            payload=first.payload or {},
            lr=first.lr,
        )


class Rows(NamedTuple):
    """A group's rows of the stacked clients: on the device (for the weights), on the host (for
    what is counted there, Adam's steps), and as a slice where they are consecutive (the usual
    case: a chunk's clients stepping together), whose views spare a gather and a scatter of the
    stacked vectors each step."""

    device: Tensor
    host: Tensor
    span: slice | None

    @classmethod
    def of(cls, clients: Sequence[int], device: torch.device) -> Rows:
        host = torch.tensor(list(clients), dtype=torch.long)
        first = clients[0] if clients else 0
        consecutive = list(clients) == list(range(first, first + len(clients)))
        span = slice(first, first + len(clients)) if consecutive else None
        return cls(from_host(host, device), host, span)

    def take(self, t: Tensor) -> Tensor:
        """These rows of ``t``: a view where they are consecutive, else a copy (in the layout
        of a view: :func:`gather_rows`)."""
        return t[self.span] if self.span is not None else gather_rows(t, self.device)

    def region(self, t: Tensor, r: slice) -> Tensor:
        """These rows of ``t`` on the entries ``r``: a view where the rows are consecutive (to be
        updated in place), else a copy (to be given back with :meth:`write`)."""
        return t[self.span, r] if self.span is not None else t[self.device, r]

    def write(self, t: Tensor, r: slice, value: Tensor) -> None:
        """Give back what :meth:`region` took, after it was updated in place (a view is
        already written)."""
        if self.span is None:
            t[self.device, r] = value

    def add(self, t: Tensor, values: Tensor) -> None:
        """Add ``values`` (one per row) into these rows of ``t``, in place."""
        if self.span is not None:
            t[self.span].add_(values)
        else:
            t.index_add_(0, self.device, values)


class Samples:
    """The chunk's clients' samples and labels in one tensor each (client ``c``'s rows from its
    offset on), so that a group step's batches are one gather: its clients' indices stacked,
    shifted by their offsets, read at once (not a gather a client, then a stack)."""

    def __init__(self, sizes: Sequence[int], prepared: bool) -> None:
        starts = [sum(sizes[:c]) for c in range(len(sizes))]
        self.sizes, self.starts, self.total = list(sizes), starts, sum(sizes)
        self.x: Tensor | None = None
        self.y: Tensor | None = None
        self.offsets: Tensor | None = None  # (clients, 1), on the samples' device
        #: whether the clients' rounds prepared their samples (all or none of them)
        self.prepared = prepared

    def adopt(self, c: int, local: LocalRound) -> None:
        """Move client ``c``'s samples (prepared or not, as its round holds them) here; its
        round then reads them as a view, and its own copy is freed (the chunk holds its
        clients' samples once, plus the one opening)."""
        xs, ys, n, start = local.xs, local.ys, self.sizes[c], self.starts[c]
        if len(xs) != n:
            raise RuntimeError(f"client {local.task.client}: {len(xs)} samples, counted {n}")
        if self.x is None or self.y is None:
            self.x, self.y = like_rows(xs, self.total), like_rows(ys, self.total)
            starts = torch.tensor(self.starts, dtype=torch.long).unsqueeze(1)
            self.offsets = from_host(starts, xs.device)
        self.x[start : start + n].copy_(xs)
        self.y[start : start + n].copy_(ys)
        local.xs, local.ys = self.x[start : start + n], self.y[start : start + n]

    def batches(self, rows: Rows, drawn: list[Draws], rt: ClientRuntime) -> tuple[Tensor, Tensor]:
        """A group's batches and labels (clients along the first axis): each client's indices
        (its own rows) read from its samples; augmented where the run augments (each client's
        draws, made from its own generator as its step came, as the sequential executor makes
        them, applied to the group's batches at once); prepared where they were not yet."""
        assert self.x is not None and self.y is not None and self.offsets is not None
        at = torch.stack([d.indices for d in drawn])
        at += rows.take(self.offsets)
        x, y = self.x[at], self.y[at]
        if rt.augment is not None:
            draws = torch.cat([d.augment for d in drawn if d.augment is not None])
            x = rt.augment.apply(x.flatten(0, 1), draws).unflatten(0, at.shape)
        if not self.prepared:  # elementwise: a group's batch at once, as a client's alone
            x = rt.prepare(x.flatten(0, 1)).unflatten(0, at.shape)
        return x, y


def aligned_rows(n: int, like: Tensor) -> Tensor:
    """``n`` uninitialised rows of ``like``'s length, each beginning on an :data:`ALIGN`-byte
    boundary (the row stride rounded up; a fresh tensor begins on one): a group's stacked
    weights then have one layout wherever its first row is, so a CUDA graph captured for a
    group shape serves every group of that shape (:func:`~fedbug.engine.executors.graphs.
    layout`), and no kernel is chosen by where a row happens to start."""
    per = ALIGN // like.element_size()
    stride = -(-like.numel() // per) * per
    return torch.empty(n, stride, dtype=like.dtype, device=like.device)[:, : like.numel()]


def gather_rows(t: Tensor, rows: Tensor) -> Tensor:
    """Rows ``rows`` of ``t``, copied; where ``t`` is a view of wider rows (as the stacked
    weights, :func:`aligned_rows`), copied with the rest of each row, so that the copy has the
    view's layout (its row stride, each row aligned) and a graph captured on consecutive rows
    serves scattered ones too."""
    n, k = t.shape if t.dim() == 2 else (0, 0)
    wide = t.dim() == 2 and t.stride(1) == 1 and t.stride(0) > k
    end = t.storage_offset() + n * t.stride(0)  # where the last row's padding ends
    if not wide or end * t.element_size() > t.untyped_storage().nbytes():
        return t.index_select(0, rows)
    full = t.as_strided((n, t.stride(0)), (t.stride(0), 1))
    return full.index_select(0, rows)[:, :k]


def like_rows(t: Tensor, n: int) -> Tensor:
    """An uninitialised tensor of ``n`` rows like ``t``'s (its dtype, device and each row's
    strides where they lay a row out densely, in any order of its axes: an NHWC batch stays
    NHWC); else rows laid out contiguously (a strided view's own strides would make rows
    overlap)."""
    row = t.shape[1:]
    numel = math.prod(row)
    dense = dense_strides(row, t.stride()[1:]) and (len(t) < 2 or t.stride(0) == numel)
    strides = (numel, *t.stride()[1:]) if dense else torch.empty(0, *row).stride()
    return torch.empty_strided((n, *row), strides, dtype=t.dtype, device=t.device)
