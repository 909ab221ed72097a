"""The round loop. It knows nothing of where local training runs (that is the executor's).

One round (:meth:`RoundLoop.play`, each step a method of :class:`RoundLoop`): select clients ->
send weights and round config -> each client trains (executor), its update screened and
aggregated per unit over the clients that trained it as it comes -> the algorithm's server
update -> the simulated system's figures -> evaluate -> one record
(:class:`~fedbug.engine.record.RoundRecord`) -> ``metrics.jsonl``, a checkpoint every N rounds,
the trackers, ``on_round``.

Every update passes :func:`fedbug.engine.checks.check_update` before aggregation: a malformed one is
dropped (``dropped`` in the round's record), a non-finite one stops the run with a
:class:`~fedbug.errors.DivergenceError` (or is dropped with ``on_divergence: skip_client``). A
round with fewer than ``min_results`` valid updates (clients dropped, lost to a timeout or an
error, whatever the executor) is short: it stops the run with a
:class:`~fedbug.errors.ShortRoundError` naming the cause (``on_short_round: stop``), or is not
aggregated and goes on (``skip``: weights unchanged, ``"aggregated": false`` in its record,
listed in the summary's ``skipped_rounds``); a run in which no round was aggregated stops all the
same, never ``completed`` with the untrained model. The run folder is locked (``.lock``) while
the run writes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import Tensor

from fedbug.algorithms.base import ServerStep
from fedbug.config import BaseConfig, config_hash
from fedbug.core.device import process_settings_kept
from fedbug.core.finite import non_finite_count
from fedbug.core.tasks import CustomTask, LossFn, Task
from fedbug.data import FederatedDataset
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.checks import check_update, divergence_hint, is_divergence
from fedbug.engine.client import (
    ClientResult,
    ClientTask,
)
from fedbug.engine.client_task import client_task
from fedbug.engine.evaluation import (
    evaluate_round,
    personalize,
    round_bytes,
    trained_sublayers,
    unevaluated,
)
from fedbug.engine.executors import Executor, build_executor
from fedbug.engine.experiment import Experiment, ModelSource
from fedbug.engine.privacy.client_level import ServerDP
from fedbug.engine.privacy.sample_server import ClientPrivacy
from fedbug.engine.record import RoundRecord
from fedbug.engine.record_updates import record_stream
from fedbug.engine.run_folder import open_run, save_checkpoint, write_summary
from fedbug.engine.short_round import ShortRound
from fedbug.engine.simulation import Simulation
from fedbug.engine.states import STATE_STORE_MIN_BYTES, ClientStates, LocalModelMean
from fedbug.engine.summary import make_summary, stopped_fields
from fedbug.errors import ConfigError, DivergenceError, FedbugError, ShortRoundError
from fedbug.integrations.tracking import Trackers
from fedbug.results import RunDir

RoundCallback = Callable[[dict[str, Any]], None]
#: ``on_phase(what, done, total)``: a step after the rounds as it goes (each client evaluated,
#: then fine-tuned, under personalized evaluation; the summary and its plot written)
PhaseCallback = Callable[[str, int, int], None]
ExecutorFactory = Callable[["Experiment"], Executor]


@dataclass
class RunResult:
    run_dir: Path | None
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    weights: Tensor = field(repr=False)


def run_experiment(
    cfg: BaseConfig,
    run_dir: Path | str | None = None,
    *,
    resume: bool = False,
    dataset: FederatedDataset | None = None,
    model: ModelSource = None,
    task: Task | str | None = None,
    loss: LossFn | None = None,
    metrics: dict[str, LossFn] | None = None,
    on_round: RoundCallback | None = None,
    stop_after: int | None = None,
    executor_factory: ExecutorFactory | None = None,
    lock_token: str | None = None,
    on_phase: PhaseCallback | None = None,
) -> RunResult:
    """Run (or resume) one experiment; write its run folder when ``run_dir`` is given.

    ``dataset`` and ``model`` replace the config's (a :class:`FederatedDataset`; a module, class
    or factory); ``task`` the config's task (a name or a :class:`~fedbug.core.tasks.Task`), or
    ``loss`` (a function of (output, y)) with optional ``metrics`` (name -> a function giving
    one batch's sum) a :class:`~fedbug.core.tasks.CustomTask`.

    ``executor_factory`` builds the executor from the experiment (default: the one the config
    names); the Flower ServerApp passes one that sends clients to its grid.

    ``on_round`` gets each round's record as it is kept; ``on_phase(what, done, total)`` each
    step after the last round (:data:`PhaseCallback`): progress, the engine prints nothing.

    ``stop_after`` ends the run after that round (as a kill would, for tests of ``resume``).
    While it runs, the run folder holds a lock (``.lock``, removed at the end, even on errors);
    a second run on the same folder raises :class:`~fedbug.errors.RunFolderBusy`. With
    ``lock_token`` this process writes the folder for the process that holds its lock with that
    token (Flower's ServerApp for the ``fedbug run`` that started it) and stops, raising
    :class:`~fedbug.errors.RunFolderBusy`, at its next write once that process is gone. A run whose
    loss or weights stop being finite raises :class:`~fedbug.errors.DivergenceError` after
    writing ``summary.json`` with ``"status": "diverged"``; a short round (fewer than
    ``min_results`` valid updates) under ``on_short_round: stop``, or a run none of whose rounds
    was aggregated, raises :class:`~fedbug.errors.ShortRoundError` after writing it with
    ``"status": "stopped"`` and a ``short_round`` block.
    """
    sources = (dataset, model, _task_of(task, loss, metrics))
    with _locked(run_dir, lock_token) as rd, contextlib.ExitStack() as cleanup:
        # what the run opens is closed however it ends, before the folder's lock is released
        return _run(
            cleanup, cfg, rd, resume, sources, on_round, stop_after, executor_factory, on_phase
        )


def _task_of(
    task: Task | str | None, loss: LossFn | None, metrics: dict[str, LossFn] | None
) -> Task | str | None:
    """The task given, or one made of ``loss`` and ``metrics``; both given is refused."""
    if loss is not None:
        if task is not None:
            raise ConfigError("give a task or a loss (with metrics), not both")
        return CustomTask(loss, metrics)
    if metrics is not None:
        raise ConfigError("metrics go with a loss: fedbug.run(cfg, loss=..., metrics=...)")
    return task


@contextlib.contextmanager
def _locked(run_dir: Path | str | None, lock_token: str | None) -> Iterator[RunDir | None]:
    """The run folder (None without one), made where missing and locked while the run writes it
    (with ``lock_token``: joined, for the process holding its lock)."""
    if run_dir is None:
        yield None
        return
    rd = RunDir(Path(run_dir))
    # the folders this call makes (the run's and any missing above it, as --out): removed again
    # while empty, so a run refused before it wrote anything leaves nothing on disk
    made = (
        [] if lock_token is not None else [d for d in (rd.path, *rd.path.parents) if not d.exists()]
    )
    if lock_token is None:
        rd.create()  # a joining process finds the folder its holder made
    try:
        if lock_token is None:
            rd.acquire_lock()
        else:
            rd.join_lock(lock_token)
    except BaseException:
        _remove_empty(made)
        raise
    try:
        rd.remove_stale_temps()  # a killed run's half-written files; the lock is ours now
        yield rd
    finally:
        rd.release_lock()
        _remove_empty(made)


def _remove_made(rd: RunDir, before: set[Path]) -> None:
    """Remove what a run that never trained wrote in its folder (all but ``before``, the
    lock kept), so that the same command can be given again."""
    for path in sorted(set(rd.path.iterdir()) - before - {rd.lock_path}, reverse=True):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty; the rest stay."""
    for d in folders:
        with contextlib.suppress(OSError):
            d.rmdir()


def _run(
    cleanup: contextlib.ExitStack,
    cfg: BaseConfig,
    rd: RunDir | None,
    resume: bool,
    sources: tuple[FederatedDataset | None, ModelSource, Task | str | None],
    on_round: RoundCallback | None,
    stop_after: int | None,
    executor_factory: ExecutorFactory | None = None,
    on_phase: PhaseCallback | None = None,
) -> RunResult:
    cleanup.enter_context(process_settings_kept())  # threads, GPU kernel flags: put back at the end
    loop = RoundLoop(cleanup, Experiment(cfg, *sources), rd, resume, on_round, executor_factory)
    cfg = loop.cfg
    t_run = time.perf_counter()
    last_round = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
    stopped: DivergenceError | ShortRoundError | None = None
    try:
        for r in range(loop.start, last_round + 1):
            loop.keep(loop.play(r))
        loop.check_any_aggregated()
    except (DivergenceError, ShortRoundError) as e:
        stopped = e
    finally:
        loop.executor.close()
    return loop.finish(stopped, time.perf_counter() - t_run, on_phase)


@dataclass
class Trained:
    """A round's updates as they came back: the valid ones (in client order, lightened), each
    client ``dropped`` with why (screened out, or lost by the executor), their aggregate (None:
    fewer than ``required`` valid updates, the round is short), and the seconds it took."""

    selected: int
    required: int
    results: list[ClientResult]
    dropped: list[dict[str, Any]]
    agg: Aggregate | None
    seconds: float


class RoundLoop:
    """The server's side of one run: what it keeps between rounds (weights, server and client
    state, the simulated system, the records) and the steps of a round (:meth:`play`)."""

    def __init__(
        self,
        cleanup: contextlib.ExitStack,
        exp: Experiment,
        rd: RunDir | None,
        resume: bool,
        on_round: RoundCallback | None,
        executor_factory: ExecutorFactory | None,
    ) -> None:
        """Set the run up, fresh or (``resume``) as the run folder's checkpoint left it; what it
        opens is closed by ``cleanup``."""
        self.exp, self.cfg, self.rd, self.on_round = exp, exp.cfg, rd, on_round
        cfg = exp.cfg
        self.weights = exp.initial_weights()
        self.server_state = exp.algorithm.init_server_state(self.weights, exp.num_clients)
        # client state on disk when it could outgrow memory (N clients x a full model of state)
        on_disk = rd is not None and exp.num_clients * exp.space.total * 4 > STATE_STORE_MIN_BYTES
        folder = rd.path / "client_states" if rd is not None and on_disk else None
        self.states = ClientStates(exp.algorithm, exp.space, folder, exp.num_clients)
        cleanup.callback(self.states.close)  # the on-disk store's files stay to resume
        self.sim = Simulation(exp)
        self.local_mean = (
            LocalModelMean(self.weights, exp.num_clients)
            if cfg.evaluation == "mean_of_local_models"
            else None
        )
        self.records: list[dict[str, Any]] = []
        self.start = 1
        self.chash = config_hash(cfg)
        before = set(rd.path.iterdir()) if rd is not None else set()
        # client-level DP (a dp: block): the clip, the noise and the accountant
        self.dp = ServerDP(cfg, exp.space) if cfg.dp is not None else None
        if rd is not None:
            self.open_folder(rd, resume)
        if self.dp is not None:
            self.dp.resume(self.records)
        # sample-level DP-SGD (a dp_sgd: block): each client's privacy spent
        self.dp_sgd = ClientPrivacy(cfg, exp.sizes) if cfg.dp_sgd is not None else None
        if self.dp_sgd is not None:
            self.dp_sgd.resume(self.records)
        try:
            self.trackers = self.open_trackers(cleanup, resume)
            # workers start only once the run folder is settled (a refused resume starts none)
            if executor_factory is not None:
                self.executor = executor_factory(exp)
            else:
                self.executor = build_executor(exp, rd.path if rd is not None else None)
        except FedbugError:
            if rd is not None and self.start == 1:  # a new run refused as it starts: undo it
                _remove_made(rd, before)
            raise
        self.model_bytes = exp.space.bytes_of(exp.shared_mask)
        self.short: ShortRound | None = None  # the round that stopped the run

    def open_folder(self, rd: RunDir, resume: bool) -> None:
        """Start the run folder, or (``resume``) take up the run where its checkpoint left it."""
        self.weights, self.server_state, self.start, self.records = open_run(
            rd,
            self.exp,
            resume,
            self.chash,
            self.weights,
            self.server_state,
            self.states,
            self.local_mean,
            self.sim,
        )

    def open_trackers(self, cleanup: contextlib.ExitStack, resume: bool) -> Trackers | None:
        """The config's trackers (TensorBoard, MLflow), closed by ``cleanup``; None without."""
        cfg = self.cfg
        if not cfg.tracking:
            return None
        if self.rd is None:
            raise ConfigError("tracking writes beside a run folder: give run_dir (or --out)")
        trackers = Trackers(list(cfg.tracking), self.rd.path, cfg, resume)
        cleanup.callback(trackers.close)
        return trackers

    def play(self, r: int) -> dict[str, Any]:
        """Round ``r``, start to end; its record."""
        exp, cfg = self.exp, self.cfg
        t0 = time.perf_counter()
        trained = self.train(r, self.client_tasks(r))
        if trained.agg is None and cfg.on_short_round == "stop":
            self.stop_short(r, trained)
        step, agg = self.server_step(r, trained.agg)
        if self.dp_sgd is not None:  # every update that reached the server spent privacy
            spent = self.dp_sgd.spend(trained.results)
            step = dataclasses.replace(step, metrics={**step.metrics, **spent})
        bytes_down = round_bytes(exp, exp.shared, r, self.model_bytes)
        simulated = self.simulate(r, trained.results, bytes_down, step.weights)
        self.weights, self.server_state = step.weights, step.state
        evaluated, t_eval = self.evaluate(r, step.eval_weights)
        return RoundRecord(
            round=r,
            evaluated=evaluated,
            results=trained.results,
            lr=exp.lr_at(r),
            bytes_down=bytes_down,
            trained_sublayers=trained_sublayers(exp, r),
            client_drift=agg.client_drift(),
            server=step.metrics,
            simulated=simulated,
            time_train=trained.seconds,
            time_eval=t_eval,
            wall_time=time.perf_counter() - t0,
            dropped=trained.dropped,
            aggregated=trained.agg is not None,
            count_memory=cfg.count_flops,
        ).to_dict()

    def client_tasks(self, r: int) -> list[ClientTask]:
        """Select round ``r``'s clients; what each is sent besides the weights."""
        exp, cfg = self.exp, self.cfg
        clients = exp.selection.select(r, cfg.seed, exp.num_clients)
        payload = exp.algorithm.payload(self.server_state)
        extra = self.sim.client_extra
        return [
            client_task(cfg, r, i, exp.mean_samples, payload=payload, extra=extra(i))
            for i in clients
        ]

    def train(self, r: int, tasks: list[ClientTask]) -> Trained:
        """The clients train (where the executor runs them); each update is screened and
        aggregated as it comes (:func:`aggregate_stream`)."""
        t_train = time.perf_counter()
        clients = [t.client for t in tasks]
        states = LazyStates(self.states, clients)
        stream = self.executor.stream_round(self.weights, tasks, states)
        if r in self.cfg.record_updates and self.rd is not None:  # for `fedbug attack`
            stream = record_stream(self.rd.path, self.exp, r, self.weights, tasks, stream, states)
        required = self.executor.required(len(tasks), self.cfg.min_results)
        # DP's clips what it is given; a secure one's sums come from the executor
        fresh = self.dp.aggregate() if self.dp is not None else self.executor.round_aggregate()
        results, dropped, agg = aggregate_stream(
            self.exp, r, stream, self.weights, self.states, self.local_mean, required, fresh
        )
        t_train = time.perf_counter() - t_train
        dropped = sorted(self.executor.lost() + dropped, key=lambda d: d["client"])
        return Trained(len(tasks), required, results, dropped, agg, t_train)

    def stop_short(self, r: int, trained: Trained) -> NoReturn:
        """Stop the run at short round ``r`` (``on_short_round: stop``)."""
        reported = len(trained.results)
        self.short = ShortRound(r, trained.selected, reported, trained.required, trained.dropped)
        raise self.short.error(self.cfg)

    def server_step(self, r: int, agg: Aggregate | None) -> tuple[ServerStep, Aggregate]:
        """The algorithm's server update from the round's aggregate, its weights checked; a
        short round skipped leaves the weights and server state as they were (an empty
        aggregate)."""
        if agg is None:
            empty = Aggregate(self.exp.space, self.cfg.weighting)
            return ServerStep(self.weights, self.weights, self.server_state), empty
        exp = self.exp
        noised = self.dp.release(agg, r) if self.dp is not None else {}
        step = exp.algorithm.server_update(self.weights, agg, self.server_state, r, exp.num_clients)
        if noised:
            step = dataclasses.replace(step, metrics={**step.metrics, **noised})
        check_weights(exp, r, step.weights)
        return step, agg

    def simulate(
        self, r: int, results: list[ClientResult], bytes_down: int, new_weights: Tensor
    ) -> dict[str, Any]:
        """The simulated system's figures of the round (empty where no client reported)."""
        if not results:
            return {}
        return self.sim.finish(r, results, bytes_down, new_weights - self.weights)

    def evaluate(self, r: int, eval_weights: Tensor) -> tuple[dict[str, Any], float]:
        """The test figures (every ``eval_every`` rounds and the last; None each in between)
        and the seconds they took."""
        cfg = self.cfg
        if r % cfg.eval_every != 0 and r != cfg.rounds:
            return unevaluated(self.exp), 0.0
        t_eval = time.perf_counter()
        evaluated = evaluate_round(self.exp, eval_weights, self.local_mean, self.states)
        return evaluated, time.perf_counter() - t_eval

    def keep(self, record: dict[str, Any]) -> None:
        """The round's record into the run's records, ``metrics.jsonl`` (then a checkpoint, every
        ``checkpoint_every`` rounds and the last), the trackers and ``on_round``."""
        cfg, rd, r = self.cfg, self.rd, record["round"]
        self.records.append(record)
        if rd is not None:
            rd.append_metrics(record)
            if r % cfg.checkpoint_every == 0 or r == cfg.rounds:
                state = (self.weights, self.server_state, self.states, self.local_mean, self.sim)
                save_checkpoint(rd, r, *state, self.chash)
        if self.trackers is not None:
            self.trackers.log(record)
        if self.on_round is not None:
            self.on_round(record)

    def check_any_aggregated(self) -> None:
        """Stop a run that reached its last round with none aggregated (every round short and
        skipped; also when resumed at the end): its model is the untrained one."""
        records = self.records
        if (
            records
            and records[-1]["round"] == self.cfg.rounds
            and not any(rec.get("aggregated", True) for rec in records)
        ):
            self.short = ShortRound.of_record(records[-1], self.executor, self.cfg)
            raise self.short.error(self.cfg, every_round=True)

    def finish(
        self,
        stopped: DivergenceError | ShortRoundError | None,
        seconds: float,
        on_phase: PhaseCallback | None = None,
    ) -> RunResult:
        """The summary (written for a completed or stopped run, and for one with no rounds);
        re-raise ``stopped`` once it is written. ``on_phase`` hears of each step after the
        rounds."""
        phase = on_phase or _no_phase
        exp, cfg, rd, records = self.exp, self.cfg, self.rd, self.records
        clients = self.sim.summary()
        summary = make_summary(cfg, records, self.chash, seconds, exp, clients, self.weights)
        if self.dp is not None:
            summary["dp"] = self.dp.summary()
        if self.dp_sgd is not None:
            summary["dp_sgd"] = self.dp_sgd.summary()
        if stopped is not None:
            short = self.short.block(str(stopped)) if self.short is not None else None
            summary.update(stopped_fields(stopped, short))
            if rd is not None:
                write_summary(rd, cfg, summary, records)
            raise stopped
        completed = bool(records) and records[-1]["round"] == cfg.rounds
        if completed and cfg.evaluation == "personalized":
            summary["pfl"] = personalize(exp, self.weights, self.states, rd, phase)
        if rd is not None and (not records or completed):
            phase(WRITING, 0, 1)
            write_summary(rd, cfg, summary, records)
            if self.trackers is not None:
                self.trackers.finish(summary)
            phase(WRITING, 1, 1)
        return RunResult(rd.path if rd else None, records, summary, self.weights)


WRITING = "writing summary and plot"


def _no_phase(what: str, done: int, total: int) -> None:
    """No one listens for the steps after the rounds."""


class LazyStates(Mapping[int, dict[str, Tensor]]):
    """The selected clients' states, each read from the store when its client starts (not all
    of a round's at once)."""

    def __init__(self, states: ClientStates, clients: list[int]) -> None:
        self.states, self.clients = states, clients

    def __getitem__(self, client: int) -> dict[str, Tensor]:
        if client not in self.clients:
            raise KeyError(client)
        return self.states.get(client)

    def __iter__(self) -> Iterator[int]:
        return iter(self.clients)

    def __len__(self) -> int:
        return len(self.clients)


def aggregate_stream(
    exp: Experiment,
    round: int,
    stream: Iterable[ClientResult],
    weights: Tensor,
    states: ClientStates,
    local_mean: LocalModelMean | None,
    required: int,
    agg: Aggregate | None = None,
) -> tuple[list[ClientResult], list[dict[str, Any]], Aggregate | None]:
    """Screen and aggregate each update as it arrives, in client order, then let its delta and
    state go (kept only where the selection reads the deltas): a round holds one update at a
    time. Returns (the kept results, lightened; ``{"client", "reason"}`` of each one dropped;
    the aggregate, or None when fewer than ``required`` valid updates came, in which case no
    client state or local model was changed). Until ``required`` updates have come, their
    states and local models wait: a round that is not aggregated writes none. ``agg``: the
    aggregate to add to (a DP one that clips each update), a plain one by default."""
    cfg = exp.cfg
    agg = agg if agg is not None else Aggregate(exp.space, cfg.weighting)
    shared_mask = exp.shared_mask
    keep_deltas = exp.selection.needs_local_deltas
    kept: list[ClientResult] = []
    dropped: list[dict[str, Any]] = []
    waiting: list[ClientResult] = []

    def commit(res: ClientResult) -> None:
        if exp.keeps_client_state:
            states.put(res.client, res.state)
        if local_mean is not None:
            local_mean.update(res.client, weights + res.delta)

    def take(res: ClientResult) -> None:
        reason = screen(exp, round, res)
        if reason is not None:
            dropped.append({"client": res.client, "reason": reason})
            return
        agg.add(
            res.delta,
            res.uploaded,
            res.num_samples,
            res.entries,
            res.extras,
            counted=shared_mask if cfg.aggregation == "full" else None,
        )
        waiting.append(res)  # whole until the round is known to aggregate
        kept.append(res if keep_deltas else dataclasses.replace(res, delta=_EMPTY, state={}))
        if len(kept) >= required:  # valid updates so far: the round will be aggregated
            for w in waiting:
                commit(w)
            waiting.clear()

    results = iter(stream)
    while (res := next(results, None)) is not None:
        take(res)
        res = None  # noqa: F841  (not held while the next client trains)
    if len(kept) < required:
        return kept, dropped, None
    return kept, dropped, agg


_EMPTY = torch.empty(0)


def screen(exp: Experiment, round: int, res: ClientResult) -> str | None:
    """Why the update ``res`` is dropped (None: it is valid). A non-finite one stops the run
    (:class:`~fedbug.errors.DivergenceError`) unless ``on_divergence: skip_client``."""
    reason = check_update(res, exp.space)
    if reason is not None and is_divergence(reason) and exp.cfg.on_divergence == "stop":
        raise DivergenceError(
            f"training diverged in round {round}: client {res.client}'s update has "
            f"{reason}; {divergence_hint(exp.cfg)}",
            round,
            res.client,
            reason,
        )
    return reason


def check_weights(exp: Experiment, round: int, weights: Tensor) -> None:
    """Stop when the aggregated weights are not finite (whatever ``on_divergence`` says: no
    single client can be dropped for it)."""
    bad = non_finite_count(weights)
    if not bad:
        return
    reason = f"non-finite global weights after aggregation ({bad} of {weights.numel()} entries)"
    raise DivergenceError(
        f"training diverged in round {round}: {reason}; {divergence_hint(exp.cfg)}",
        round,
        None,
        reason,
    )
