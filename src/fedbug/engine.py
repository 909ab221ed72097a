"""The round loop. It knows nothing of where local training runs (that is the executor's).

One round: select clients -> send weights and round config -> each client trains (executor) ->
aggregate per unit over the clients that trained it -> algorithm's server update -> evaluate ->
one metrics record -> checkpoint every N rounds.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import Tensor, nn

from fedbug.aggregate import Aggregate
from fedbug.algorithms import Algorithm, build_algorithm
from fedbug.client import ClientData, ClientRuntime, ClientTask, TrainSettings
from fedbug.config import BaseConfig, config_hash, resolve
from fedbug.data import FederatedDataset, load_dataset, partition, partition_summary
from fedbug.data.augment import AUGMENTATIONS
from fedbug.errors import CheckpointError, ConfigError
from fedbug.evaluate import Evaluator
from fedbug.executors import SequentialExecutor
from fedbug.layout import build_layout
from fedbug.models import build_model
from fedbug.policies import StepCtx, build_policy
from fedbug.results import RunDir, environment, plot_run
from fedbug.seeding import derive_seed, numpy_rng
from fedbug.selection import SELECTIONS
from fedbug.units import ParamSpace, find_units, traced_module_order

ModelSource = nn.Module | Callable[[], nn.Module] | None
RoundCallback = Callable[[dict[str, Any]], None]


@dataclass
class RunResult:
    run_dir: Path | None
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    weights: Tensor = field(repr=False)


class Experiment:
    """Everything a run needs, built once from a config (and optionally a user's model/data)."""

    def __init__(
        self, cfg: BaseConfig, dataset: FederatedDataset | None = None, model: ModelSource = None
    ) -> None:
        self.cfg = cfg = resolve(cfg)
        torch.set_num_threads(cfg.threads)
        data_dir = Path(cfg.data_dir).expanduser() if cfg.data_dir else None
        ds = dataset if dataset is not None else load_dataset(cfg.dataset, data_dir)
        if cfg.subsample < 1.0:
            ds = subsample(ds, cfg.subsample)
        self.dataset = ds
        if cfg.partition == "natural":
            self.parts, ds = natural_clients(ds, cfg.num_clients, cfg.seed)
            self.dataset = ds
        else:
            self.parts = partition(
                ds.train_y,
                cfg.num_clients,
                cfg.partition,
                cfg.alpha,
                cfg.seed,
                cfg.unbalanced_sigma,
                ds.num_classes,
            )
        self.num_clients = len(self.parts)
        blocks = {name: getattr(cfg, name) for name in type(cfg).model_fields}
        self.algorithm: Algorithm = build_algorithm(cfg.algorithm, cfg.global_lr, blocks)
        if cfg.evaluation == "global" and not self.algorithm.has_global_model:
            raise ConfigError(
                f"{cfg.algorithm} keeps part of every model on its client, so there is no global "
                "model to evaluate; use evaluation: personalized"
            )
        example = ds.prepare(ds.train_x[:2])
        model = self._build_model(model)
        self.classifier = traced_module_order(model, example)[-1]
        self.template = self.algorithm.wrap_model(model, self.classifier)
        self.units = find_units(self.template, example, names=cfg.units)
        self.space = ParamSpace(self.template, self.units)
        self.layout = build_layout(
            self.units, cfg.head_units, cfg.sublayers, self.algorithm.extra_modules
        )
        self.algorithm.setup(self.layout)
        self.policy = build_policy(cfg.policy, gu_ratio=cfg.gu_ratio, fixed_units=cfg.fixed_units)
        if not len(self.policy.trainable_units(StepCtx(1, 1, self.space.num_units))):
            raise ConfigError(f"policy {cfg.policy!r} trains no unit of this model")
        sel = cfg.resolved_selection()
        self.selection = (
            SELECTIONS.get(sel)(cfg.clients_per_round)
            if sel == "uniform"
            else SELECTIONS.get(sel)(cfg.participation)
        )
        self.settings = TrainSettings(
            local_epochs=cfg.local_epochs,
            local_steps=cfg.local_steps,
            batch_size=cfg.batch_size,
            optimizer=cfg.optimizer,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            clip_grad_norm=cfg.clip_grad_norm,
            count_flops=cfg.count_flops,
        )
        sizes = [len(p) for p in self.parts]
        self.sizes = sizes
        self.mean_samples = sum(sizes) / len(sizes)
        self.evaluator = Evaluator(self.template, self.space, ds, cfg.eval_batch_size)

    def _build_model(self, model: ModelSource) -> nn.Module:
        ds, cfg = self.dataset, self.cfg
        if model is None:
            return build_model(
                cfg.model, ds.input_shape, ds.num_classes, cfg.seed, **cfg.model_options
            )
        if isinstance(model, nn.Module):
            return copy.deepcopy(model)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(cfg.seed, "model"))
            return model()

    @property
    def keeps_client_state(self) -> bool:
        return self.algorithm.stateful_clients or bool(
            self.algorithm.local_units(self.space.num_units)
        )

    def client_data(self, client: int) -> ClientData:
        idx = self.parts[client]
        return ClientData(self.dataset.train_x[idx], self.dataset.train_y[idx])

    def make_runtime(self) -> ClientRuntime:
        name = self.dataset.augmentation if self.cfg.augment == "auto" else self.cfg.augment
        return ClientRuntime(
            copy.deepcopy(self.template),
            self.space,
            self.policy,
            self.algorithm,
            self.settings,
            self.dataset.prepare,
            AUGMENTATIONS.get(name),
            self.classifier,
        )

    def initial_weights(self) -> Tensor:
        return self.space.flatten(self.template)

    def lr_at(self, round: int) -> float:
        return self.cfg.lr * self.cfg.lr_decay ** (round - 1)


def subsample(ds: FederatedDataset, share: float) -> FederatedDataset:
    """The same data set with a fixed share of each class's training samples (the same for
    every seed, so twins of an experiment differ only where their seeds do)."""
    if ds.natural_clients is not None:
        raise ConfigError(f"subsample does not apply to {ds.name!r}'s natural clients")
    rng = numpy_rng(0, "subsample", ds.name)
    y = ds.train_y.numpy()
    keep = []
    for c in range(ds.num_classes):
        idx = (y == c).nonzero()[0]
        k = max(1, round(share * len(idx))) if len(idx) else 0
        keep.append(rng.permutation(idx)[:k])
    kept = torch.from_numpy(np.sort(np.concatenate(keep)))
    return dataclasses.replace(ds, train_x=ds.train_x[kept], train_y=ds.train_y[kept])


def natural_clients(
    ds: FederatedDataset, num_clients: int, seed: int
) -> tuple[list[Tensor], FederatedDataset]:
    """The data set's own clients (LEAF writers, speaking roles), a seeded subset of
    ``num_clients`` of them when fewer are asked for, and the data set with its test set cut to
    those clients' test samples (as LEAF evaluates on the users it sampled)."""
    if ds.natural_clients is None:
        raise ConfigError(
            f"data set {ds.name!r} has no natural clients; use partition: iid or dirichlet"
        )
    n = len(ds.natural_clients)
    if num_clients > n:
        raise ConfigError(
            f"num_clients={num_clients} but {ds.name!r} has {n} natural clients; use at most {n}"
        )
    if num_clients == n:
        return list(ds.natural_clients), ds
    chosen = sorted(numpy_rng(seed, "natural-clients").choice(n, size=num_clients, replace=False))
    parts = [ds.natural_clients[i] for i in chosen]
    if ds.natural_test_clients is None:
        return parts, ds
    tests = [ds.natural_test_clients[i] for i in chosen]
    keep = torch.cat(tests) if tests else torch.zeros(0, dtype=torch.long)
    starts = np.cumsum([0] + [len(t) for t in tests])
    renumbered = [torch.arange(a, b) for a, b in zip(starts[:-1], starts[1:])]
    cut = dataclasses.replace(
        ds,
        test_x=ds.test_x[keep],
        test_y=ds.test_y[keep],
        natural_clients=parts,
        natural_test_clients=renumbered,
    )
    return parts, cut


class ClientStates:
    """Per-client algorithm state (FedDyn's lambda_i), created on first use."""

    def __init__(self, algorithm: Algorithm, space: ParamSpace) -> None:
        self.algorithm = algorithm
        self.space = space
        self.states: dict[int, dict[str, Tensor]] = {}

    def get(self, client: int) -> dict[str, Tensor]:
        if client not in self.states:
            return self.algorithm.init_client_state(self.space)
        return self.states[client]

    def put(self, client: int, state: dict[str, Tensor]) -> None:
        if state:
            self.states[client] = state

    def state_dict(self) -> dict[str, dict[str, Tensor]]:
        return {str(k): v for k, v in sorted(self.states.items())}

    def load_state_dict(self, d: dict[str, dict[str, Tensor]]) -> None:
        self.states = {int(k): v for k, v in d.items()}


class LocalModelMean:
    """The mean of ALL clients' latest local models (a client never selected holds the initial
    model): what the FedBug and FedDyn authors' code plots beside the server model."""

    def __init__(self, initial: Tensor, num_clients: int) -> None:
        self.initial = initial.clone()
        self.num_clients = num_clients
        self.latest: dict[int, Tensor] = {}
        self.total = initial.double() * num_clients

    def update(self, client: int, local: Tensor) -> None:
        self.total += local.double() - self.latest.get(client, self.initial).double()
        self.latest[client] = local.clone()

    def mean(self) -> Tensor:
        return (self.total / self.num_clients).float()

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total, "latest": {str(k): v for k, v in self.latest.items()}}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.total = d["total"]
        self.latest = {int(k): v for k, v in d["latest"].items()}


def run_experiment(
    cfg: BaseConfig,
    run_dir: Path | str | None = None,
    *,
    resume: bool = False,
    dataset: FederatedDataset | None = None,
    model: ModelSource = None,
    on_round: RoundCallback | None = None,
    stop_after: int | None = None,
) -> RunResult:
    """Run (or resume) one experiment; write its run folder when ``run_dir`` is given.

    ``stop_after`` ends the run after that round (as a kill would, for tests of ``resume``).
    """
    exp = Experiment(cfg, dataset, model)
    cfg = exp.cfg
    rd = RunDir(Path(run_dir)) if run_dir is not None else None
    weights = exp.initial_weights()
    server_state = exp.algorithm.init_server_state(weights, exp.num_clients)
    states = ClientStates(exp.algorithm, exp.space)
    local_mean = (
        LocalModelMean(weights, exp.num_clients)
        if cfg.evaluation == "mean_of_local_models"
        else None
    )
    records: list[dict[str, Any]] = []
    start = 1
    chash = config_hash(cfg)
    executor = SequentialExecutor(exp.make_runtime(), exp.client_data)
    if rd is not None:
        if resume and rd.checkpoint_path.exists():
            ck = rd.load_checkpoint()
            if ck.get("config_hash") != chash:
                raise CheckpointError(
                    f"checkpoint in {str(rd.path)!r} was written by another config "
                    f"({ck.get('config_hash')} vs {chash}); resume with the same config"
                )
            weights = ck["weights"]
            server_state = ck["server_state"]
            states.load_state_dict(ck["client_states"])
            if local_mean is not None:
                local_mean.load_state_dict(ck["local_models"])
            start = int(ck["round"]) + 1
            records = rd.truncate_metrics(start - 1)
        elif rd.exists_with_results() and not resume:
            raise ConfigError(
                f"run folder {str(rd.path)!r} already holds a run; pass --resume to continue it "
                "or choose another --out"
            )
        else:
            rd.create()
            rd.truncate_metrics(0)
            rd.write_config(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
            rd.write_json(
                "partition.json",
                {
                    "summary": partition_summary(
                        exp.parts, exp.dataset.train_y, exp.dataset.num_classes
                    ),
                    "clients": [p.tolist() for p in exp.parts],
                },
            )
    t_run = time.perf_counter()
    last_round = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
    shared = set(exp.algorithm.shared_units(exp.space.num_units))
    model_bytes = exp.space.bytes_of([u in shared for u in range(exp.space.num_units)])
    try:
        for r in range(start, last_round + 1):
            t0 = time.perf_counter()
            clients = exp.selection.select(r, cfg.seed, exp.num_clients)
            payload = exp.algorithm.payload(server_state)
            tasks = [
                ClientTask(r, i, cfg.seed, exp.lr_at(r), exp.mean_samples, payload, cfg.rounds)
                for i in clients
            ]
            client_states = {i: states.get(i) for i in clients}
            t_train = time.perf_counter()
            results = executor.run_round(weights, tasks, client_states)
            t_train = time.perf_counter() - t_train
            agg = Aggregate(exp.space, cfg.weighting)
            for res in results:
                agg.add(res.delta, res.uploaded, res.num_samples)
                if exp.keeps_client_state:
                    states.put(res.client, res.state)
                if local_mean is not None:
                    local_mean.update(res.client, weights + res.delta)
            step = exp.algorithm.server_update(weights, agg, server_state, r, exp.num_clients)
            weights, server_state = step.weights, step.state
            test_acc = test_loss = None
            extra_eval: dict[str, Any] = {}
            t_eval = 0.0
            if r % cfg.eval_every == 0 or r == cfg.rounds:
                t_eval = time.perf_counter()
                if local_mean is not None:
                    test_acc, test_loss = exp.evaluator.evaluate(local_mean.mean())
                    acc_s, loss_s = exp.evaluator.evaluate(step.eval_weights)
                    extra_eval = {"test_acc_server": acc_s, "test_loss_server": loss_s}
                else:
                    test_acc, test_loss = exp.evaluator.evaluate(step.eval_weights)
                t_eval = time.perf_counter() - t_eval
            n = len(results)
            record: dict[str, Any] = {
                "round": r,
                "test_acc": test_acc,
                "test_loss": test_loss,
                **extra_eval,
                "train_loss": sum(x.metrics["train_loss"] for x in results) / n,
                "clients": [x.client for x in results],
                "num_clients": n,
                "lr": exp.lr_at(r),
                "trained_params": sum(x.metrics["trained_params"] for x in results) / n,
                "bytes_down": n * model_bytes,
                "bytes_up": sum(x.metrics["bytes_up"] for x in results),
                "flops": sum(x.metrics["flops"] for x in results),
                "client_drift": agg.client_drift(),
                **step.metrics,
                "time_train": t_train,
                "time_eval": t_eval,
                "wall_time": time.perf_counter() - t0,
            }
            records.append(record)
            if rd is not None:
                rd.append_metrics(record)
                if r % cfg.checkpoint_every == 0 or r == cfg.rounds:
                    rd.save_checkpoint(
                        {
                            "round": r,
                            "weights": weights,
                            "server_state": server_state,
                            "client_states": states.state_dict(),
                            "local_models": local_mean.state_dict() if local_mean else {},
                            "config_hash": chash,
                        }
                    )
            if on_round is not None:
                on_round(record)
    finally:
        executor.close()
    summary = make_summary(cfg, records, chash, time.perf_counter() - t_run, exp)
    if rd is not None and (not records or records[-1]["round"] == cfg.rounds):
        rd.write_json("summary.json", summary)
        if records:
            plot_run(records, rd.path / "accuracy.png", f"{cfg.name} (seed {cfg.seed})")
    return RunResult(rd.path if rd else None, records, summary, weights)


def make_summary(
    cfg: BaseConfig, records: list[dict[str, Any]], chash: str, seconds: float, exp: Experiment
) -> dict[str, Any]:
    evaluated = [r for r in records if r["test_acc"] is not None]
    last = evaluated[-1] if evaluated else None
    return {
        "name": cfg.name,
        "status": "completed" if records and records[-1]["round"] == cfg.rounds else "partial",
        "seed": cfg.seed,
        "config_hash": chash,
        "rounds": records[-1]["round"] if records else 0,
        "final_acc": last["test_acc"] if last else None,
        "final_loss": last["test_loss"] if last else None,
        "best_acc": max((r["test_acc"] for r in evaluated), default=None),
        "num_clients": exp.num_clients,
        "num_units": exp.space.num_units,
        "units": [u.name for u in exp.units],
        "num_params": sum(exp.space.unit_param_numel),
        "total_flops": sum(r["flops"] for r in records),
        "total_bytes_up": sum(r["bytes_up"] for r in records),
        "seconds": seconds,
        "environment": environment(),
        "config": cfg.model_dump(mode="json"),
    }
