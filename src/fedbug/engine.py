"""The round loop. It knows nothing of where local training runs (that is the executor's).

One round: select clients -> send weights and round config -> each client trains (executor) ->
aggregate per unit over the clients that trained it -> algorithm's server update -> evaluate ->
one metrics record -> checkpoint every N rounds.

Every update passes :func:`fedbug.checks.check_update` before aggregation: a malformed one is
dropped (``dropped`` in the round's record), a non-finite one stops the run with a
:class:`~fedbug.errors.DivergenceError` (or is dropped with ``on_divergence: skip_client``); a
round with fewer than ``min_results`` valid updates is not aggregated. The run folder is locked
(``.lock``) while the run writes it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
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
from fedbug.algorithms.base import ServerStep
from fedbug.checks import check_update, divergence_hint, is_divergence
from fedbug.client import (
    ClientData,
    ClientResult,
    ClientRuntime,
    ClientTask,
    TrainSettings,
    with_memory_format,
)
from fedbug.config import BaseConfig, config_hash, resolve
from fedbug.data import FederatedDataset, load_dataset, partition, partition_summary
from fedbug.data.augment import AUGMENTATIONS
from fedbug.data.partition import client_test_split
from fedbug.data.partition_plot import plot_partition
from fedbug.errors import CheckpointError, ConfigError, DivergenceError
from fedbug.evaluate import Evaluator
from fedbug.executors import Executor, build_executor
from fedbug.layout import build_layout
from fedbug.models import build_model
from fedbug.pfl import (
    FinetuneSettings,
    PersonalizedEvaluator,
    clients_csv,
    pfl_summary,
    plot_clients,
)
from fedbug.pfl import summarise as summarise_scores
from fedbug.policies import StepCtx, build_policy
from fedbug.policies.base import Intersection
from fedbug.policies.schedule import RoundSchedule
from fedbug.results import RunDir, atomic_write_text, environment, plot_run
from fedbug.seeding import derive_seed, numpy_rng
from fedbug.selection import SELECTIONS, SelectionFeedback
from fedbug.state_store import StateStore
from fedbug.system import Clock, SystemModel, per_sample_costs
from fedbug.units import ParamSpace, find_units, traced_module_order

ModelSource = nn.Module | Callable[[], nn.Module] | None
RoundCallback = Callable[[dict[str, Any]], None]
ExecutorFactory = Callable[["Experiment"], Executor]


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
        self.sources = (dataset, model)  # what worker processes rebuild the experiment from
        data_dir = Path(cfg.data_dir).expanduser() if cfg.data_dir else None
        ds = (
            dataset
            if dataset is not None
            else load_dataset(cfg.dataset, data_dir, cfg.dataset_options, cfg.num_clients)
        )
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
                cfg.min_client_samples,
            )
        # Per-client test sets: test_parts[i] indexes self.dataset.test_x / test_y (see
        # personal_test_sets); for personalized evaluation, and for acc_client_mean beside a
        # global model when clients have their own test samples (LEAF) or pfl_test is set.
        self.test_parts: list[Tensor] | None = None
        natural_tests = cfg.partition == "natural" and ds.natural_test_clients is not None
        if cfg.evaluation == "personalized" or cfg.pfl_test is not None or natural_tests:
            self.parts, self.test_parts, ds = personal_test_sets(ds, self.parts, cfg)
            self.dataset = ds
        self.num_clients = len(self.parts)
        blocks = {name: cfg.options(name) for name in type(cfg).model_fields}
        self.algorithm: Algorithm = build_algorithm(cfg.algorithm, cfg.global_lr, blocks)
        if cfg.evaluation != "personalized" and not self.algorithm.has_global_model:
            raise ConfigError(
                f"{cfg.algorithm} keeps part of every model on its client, so there is no global "
                f"model to evaluate (evaluation: {cfg.evaluation}); use evaluation: personalized"
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
        # the units the server and clients exchange (the rest stay on each client)
        self.shared = set(self.algorithm.shared_units(self.space.num_units))
        self.shared_mask = [u in self.shared for u in range(self.space.num_units)]
        # freeze policies see the model's own units, not those an algorithm adds (as the client)
        policy_units = self.space.num_units - len(self.layout.extra)
        self.policy = build_policy(cfg.policy, cfg.options(cfg.policy))
        if not len(self.policy.trainable_units(StepCtx(1, 1, policy_units))):
            raise ConfigError(f"policy {cfg.policy!r} trains no unit of this model")
        self.schedule: RoundSchedule | None = None
        if cfg.schedule != "none":
            self.schedule = RoundSchedule.build(
                cfg.schedule, self.layout.sublayers, cfg.rounds, cfg.unfreeze_rounds
            )
            self.policy = Intersection((self.policy, self.schedule))
            for t in sorted({t + 1 for t in self.schedule.unfreeze_rounds}):
                ctx = StepCtx(1, 1, policy_units, t, 0, cfg.rounds)
                if not len(self.policy.trainable_units(ctx)):
                    raise ConfigError(
                        f"policy {cfg.policy!r} under schedule {cfg.schedule!r} trains no unit "
                        f"in round {t}; use another policy or schedule"
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
        self.system: SystemModel | None = None
        if cfg.system is not None:
            labels = ds.train_y[: len(example)]
            costs = per_sample_costs(
                cfg.system,
                copy.deepcopy(self.template),
                self.units,
                example,
                labels,
                self.algorithm.loss,
            )[:policy_units]  # an algorithm's own units (FedROD's personal head) always train
            self.system = SystemModel(
                cfg.system,
                self.space,
                costs,
                sizes,
                cfg.local_epochs,
                self.num_clients,
                cfg.seed,
                policy_units=policy_units,
                shared=self.shared_mask,
            )
            self.algorithm.setup_system(self.system, copy.deepcopy(self.template), example, labels)
        self.policy.setup_server(self.system, cfg)
        self.selection = SELECTIONS.get(cfg.resolved_selection()).build(
            cfg, self.num_clients, self.system
        )
        self.evaluator = Evaluator(
            self.template, self.space, ds, cfg.eval_batch_size, cfg.memory_format
        )
        self.personal: PersonalizedEvaluator | None = None
        if self.test_parts is not None:
            self.personal = PersonalizedEvaluator(
                self.template,
                self.space,
                self.algorithm,
                ds,
                self.parts,
                self.test_parts,
                cfg.eval_batch_size,
                self.augmentation(),
                cfg.memory_format,
            )

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

    def augmentation(self) -> Callable[[Tensor, torch.Generator], Tensor] | None:
        name = self.dataset.augmentation if self.cfg.augment == "auto" else self.cfg.augment
        return AUGMENTATIONS.get(name)

    def make_runtime(self) -> ClientRuntime:
        return ClientRuntime(
            copy.deepcopy(self.template),
            self.space,
            self.policy,
            self.algorithm,
            self.settings,
            with_memory_format(self.dataset.prepare, self.cfg.memory_format),
            self.augmentation(),
            self.classifier,
        )

    def initial_weights(self) -> Tensor:
        return self.space.flatten(self.template)

    def lr_at(self, round: int) -> float:
        return self.cfg.lr * self.cfg.lr_decay ** (round - 1)


def subsample(ds: FederatedDataset, share: float) -> FederatedDataset:
    """The same data set with a fixed share of each class's training samples, or, for a data
    set with natural clients (LEAF), of each client's train and test samples (at least one of
    each it had), in their order. The same for every seed, so twins of an experiment differ
    only where their seeds do."""
    if ds.natural_clients is not None:
        return _subsample_natural(ds, share)
    rng = numpy_rng(0, "subsample", ds.name)
    y = ds.train_y.numpy()
    keep = []
    for c in range(ds.num_classes):
        idx = (y == c).nonzero()[0]
        k = max(1, round(share * len(idx))) if len(idx) else 0
        keep.append(rng.permutation(idx)[:k])
    kept = torch.from_numpy(np.sort(np.concatenate(keep)))
    return dataclasses.replace(ds, train_x=ds.train_x[kept], train_y=ds.train_y[kept])


def _share_of_each(
    parts: list[Tensor], share: float, rng: np.random.Generator
) -> tuple[Tensor, list[Tensor]]:
    """A fixed share of each part's indices (sorted, at least one of a non-empty part): the
    kept indices and each part renumbered into them."""
    kept, renumbered, start = [], [], 0
    for p in parts:
        k = max(1, round(share * len(p))) if len(p) else 0
        chosen = torch.from_numpy(np.sort(rng.permutation(len(p))[:k])).long()
        kept.append(p[chosen])
        renumbered.append(torch.arange(start, start + k))
        start += k
    return (torch.cat(kept) if kept else torch.zeros(0, dtype=torch.long)), renumbered


def _subsample_natural(ds: FederatedDataset, share: float) -> FederatedDataset:
    rng = numpy_rng(0, "subsample", ds.name)
    train, parts = _share_of_each(list(ds.natural_clients or []), share, rng)
    changes: dict[str, Any] = {
        "train_x": ds.train_x[train],
        "train_y": ds.train_y[train],
        "natural_clients": parts,
    }
    if ds.natural_test_clients is not None:
        test, test_parts = _share_of_each(list(ds.natural_test_clients), share, rng)
        changes.update(
            test_x=ds.test_x[test], test_y=ds.test_y[test], natural_test_clients=test_parts
        )
    return dataclasses.replace(ds, **changes)


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


def personal_test_sets(
    ds: FederatedDataset, parts: list[Tensor], cfg: BaseConfig
) -> tuple[list[Tensor], list[Tensor], FederatedDataset]:
    """Each client's test set for ``evaluation: personalized``: (train parts, test parts, data
    set), the test parts indexing the returned data set's ``test_x`` / ``test_y``.

    * natural partitions with per-client test samples: the data set's ``natural_test_clients``;
    * ``pfl_test: matched``: the official test set dealt after each client's train classes
      (:func:`fedbug.data.partition.client_test_split`; test samples of classes no client holds
      stay unused but remain in the data set's test set, which global evaluation still uses);
    * ``pfl_test: holdout``: ``test_fraction`` of each client's train part, stratified per class,
      moves to its test part, and the data set's test set BECOMES those held-out train samples
      (concatenated client by client, so client i's are one contiguous block): the official test
      set is not used at all. The train tensors are kept whole; held-out samples are in no train
      part.
    """
    if cfg.partition == "natural" and ds.natural_test_clients is not None:
        return parts, list(ds.natural_test_clients), ds
    scheme = cfg.pfl_test or "matched"
    split = client_test_split(
        ds.train_y, parts, ds.test_y, scheme, cfg.seed, cfg.test_fraction, ds.num_classes
    )
    if split.test_source == "test":
        return split.train_parts, split.test_parts, ds
    held = torch.cat(split.test_parts) if split.test_parts else torch.zeros(0, dtype=torch.long)
    starts = np.cumsum([0] + [len(t) for t in split.test_parts])
    renumbered = [torch.arange(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]
    out = dataclasses.replace(ds, test_x=ds.train_x[held], test_y=ds.train_y[held])
    return split.train_parts, renumbered, out


class Simulation:
    """Simulated devices and stateful selection around one round (FreezeFL Sec. IV-V): the
    per-client round config (soft deadline, the time each freezing choice would be charged),
    the clients' times, round length and clock, the deadline update and the selection's
    feedback. Everything it keeps is in :meth:`state_dict` for an exact resume."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.clock = Clock()
        self.participations = [0] * exp.num_clients

    def client_extra(self, client: int) -> dict[str, Any]:
        """Client ``client``'s round config: the algorithm's (Fjord's width), then the
        policy's (FreezeFL's soft deadline and charged times)."""
        exp = self.exp
        return {
            **exp.algorithm.client_config(client, exp.system),
            **exp.policy.client_config(client),
        }

    def charged_time(self, res: ClientResult, bytes_down: int) -> float:
        """What client ``res.client`` is charged: the policy's own figure, else its counted
        FLOPs and bytes (or its full-model time when costs are measured)."""
        system = self.exp.system
        if res.charged_time is not None:
            return float(res.charged_time)
        if self.exp.cfg.system.cost == "measured":
            return system.full_time(res.client)
        work = res.flops - res.probe_flops
        down = res.bytes_down if res.bytes_down is not None else bytes_down
        return system.time(res.client, work, down, res.bytes_up)

    def finish(
        self, r: int, results: list[ClientResult], bytes_down: int, delta_global: Tensor
    ) -> dict[str, Any]:
        exp = self.exp
        for res in results:
            self.participations[res.client] += 1
        fields: dict[str, Any] = {}
        times: dict[int, float] = {}
        if exp.system is not None:
            times = {res.client: self.charged_time(res, bytes_down) for res in results}
            sent = exp.policy.round_deadline()
            fields["round_length"] = self.clock.advance(list(times.values()))
            fields["sim_clock"] = self.clock.now
            fields["soft_deadline"] = sent
            exp.policy.end_round(list(times.values()))
        exp.selection.update(
            SelectionFeedback(
                round=r,
                clients=[res.client for res in results],
                num_clients=exp.num_clients,
                n_frozen={res.client: res.n_frozen for res in results},
                num_units=exp.space.num_units - len(exp.layout.extra),
                space=exp.space,
                local_deltas={res.client: res.delta for res in results},
                trained={res.client: res.trained for res in results},
                global_delta=delta_global,
                times=times,
                u_sys=(  # Fjord + reputation (FreezeFL Table IV): U_sys = p_max
                    {res.client: float(res.u_sys) for res in results if res.u_sys is not None}
                    if all(res.u_sys is not None for res in results)
                    else None
                ),
            )
        )
        if exp.system is not None:
            fields["per_client"] = [
                {
                    "id": res.client,
                    "ability": float(exp.system.ability(res.client)),
                    "n_frozen": res.n_frozen,
                    "width": res.width,
                    "bytes_down": res.bytes_down if res.bytes_down is not None else bytes_down,
                    "bytes_up": res.bytes_up,
                    "flops": res.flops,
                    "time": times[res.client],
                    "utility": exp.selection.client_utility(res.client),
                }
                for res in results
            ]
        return fields

    def state_dict(self) -> dict[str, Any]:
        exp = self.exp
        return {
            "clock": self.clock.state_dict(),
            "system": exp.system.state_dict() if exp.system is not None else {},
            "deadline": exp.policy.state_dict(),
            "selection": exp.selection.state_dict(),
            "participations": torch.tensor(self.participations),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        exp = self.exp
        self.clock.load_state_dict(d["clock"])
        if exp.system is not None:
            exp.system.load_state_dict(d["system"])  # measured costs are not re-timed
        exp.policy.load_state_dict(d["deadline"])
        exp.selection.load_state_dict(d["selection"])
        self.participations = [int(x) for x in d["participations"]]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"participations": list(self.participations)}
        system = self.exp.system
        if system is not None:
            out["abilities"] = [float(system.ability(k)) for k in range(self.exp.num_clients)]
            out["full_model_time"] = [system.full_time(k) for k in range(self.exp.num_clients)]
            out["sim_clock"] = self.clock.now
            if system.width_costs is not None:  # Fjord: per-sample FLOPs of each width
                out["width_costs"] = {str(p): c for p, c in system.width_costs.items()}
        return out


#: Client state is kept in a memory-mapped store under the run folder when N full models of it
#: would take more than this (smaller runs keep it in memory and in the checkpoint).
STATE_STORE_MIN_BYTES = 256 << 20


class ClientStates:
    """Per-client algorithm state (FedDyn's lambda_i), created on first use.

    With ``store_dir`` and ``num_clients`` (a run folder, and N full models of state over
    :data:`STATE_STORE_MIN_BYTES`), states live in a memory-mapped
    :class:`~fedbug.state_store.StateStore` in ``<run>/client_states`` and the checkpoint holds
    only its generation; a state the store's layout does not fit stays in memory. Without, all
    states are in memory and in the checkpoint."""

    def __init__(
        self,
        algorithm: Algorithm,
        space: ParamSpace,
        store_dir: Path | None = None,
        num_clients: int | None = None,
    ) -> None:
        self.algorithm = algorithm
        self.space = space
        self.states: dict[int, dict[str, Tensor]] = {}
        self.store_dir = store_dir if num_clients is not None else None
        self.num_clients = num_clients
        self.store: StateStore | None = None

    def get(self, client: int) -> dict[str, Tensor]:
        if client in self.states:
            return self.states[client]
        stored = self.store.get(client) if self.store is not None else None
        return stored if stored is not None else self.algorithm.init_client_state(self.space)

    def put(self, client: int, state: dict[str, Tensor]) -> None:
        if not state:
            return
        if self.store is None and self.store_dir is not None:
            self.store = StateStore.create(self.store_dir, self.num_clients, state)
        if self.store is not None and self.store.accepts(state):
            self.store.put(client, state)
            self.states.pop(client, None)
        else:
            self.states[client] = state

    def close(self) -> None:
        """Unmap the on-disk store (its files stay for a resume); states in memory are kept."""
        if self.store is not None:
            self.store.close()
            self.store = None

    def state_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {str(k): v for k, v in sorted(self.states.items())}
        if self.store is not None:
            d["__store__"] = {"generation": self.store.commit()}
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        d = dict(d)
        stored = d.pop("__store__", None)
        self.states = {int(k): v for k, v in d.items()}
        if self.store is not None:
            self.store.close()
            self.store = None
        if stored is not None:
            if self.store_dir is None:
                raise CheckpointError("this checkpoint keeps client states in its run folder")
            self.store = StateStore.open(self.store_dir, int(stored["generation"]))


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


_CHECKPOINT_KEYS = ("round", "weights", "server_state", "client_states", "simulation")


def check_checkpoint_fits(
    ck: dict[str, Any],
    path: Path,
    cfg: BaseConfig,
    weights: Tensor,
    server_state: dict[str, Any],
    states: ClientStates,
) -> None:
    """Refuse, with one :class:`CheckpointError` naming ``path``, a checkpoint whose contents do
    not fit this run's model (weights of another size, say: written by another model or fedbug
    version under the same config hash), before any of it is loaded."""
    fix = "start the run again in another --out (or remove this run folder)"
    missing = [k for k in _CHECKPOINT_KEYS if k not in ck]
    if missing:
        raise CheckpointError(
            f"checkpoint {str(path)!r} lacks {', '.join(missing)}; it was not written by this "
            f"fedbug version; {fix}"
        )
    got = ck["weights"]
    if not isinstance(got, Tensor) or got.shape != weights.shape or got.dtype != weights.dtype:
        what = (
            f"{got.numel():,} {str(got.dtype).removeprefix('torch.')} weights"
            if isinstance(got, Tensor)
            else f"weights of type {type(got).__name__}"
        )
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds {what} where model {cfg.model!r} has "
            f"{weights.numel():,} {str(weights.dtype).removeprefix('torch.')}; it was written by "
            f"another model; {fix}"
        )
    r = ck["round"]
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= cfg.rounds:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is at round {r!r}, outside 0..{cfg.rounds}; {fix}"
        )
    fresh_client = states.algorithm.init_client_state(states.space)
    parts = [(ck["server_state"], server_state, "server state")]
    if not isinstance(ck["client_states"], dict):
        raise CheckpointError(f"checkpoint {str(path)!r} has malformed client states; {fix}")
    parts += [
        (s, fresh_client, f"client {k} state")
        for k, s in ck["client_states"].items()
        if k != "__store__"
    ]
    for saved, fresh, what in parts:
        if not isinstance(saved, dict) or not set(fresh) <= set(saved):
            raise CheckpointError(
                f"checkpoint {str(path)!r}: its {what} does not fit algorithm "
                f"{cfg.algorithm!r}; {fix}"
            )
        for key, t in fresh.items():
            s = saved[key]
            if isinstance(t, Tensor) and (not isinstance(s, Tensor) or s.shape != t.shape):
                raise CheckpointError(
                    f"checkpoint {str(path)!r}: its {what} {key!r} does not fit model "
                    f"{cfg.model!r}; {fix}"
                )


def run_experiment(
    cfg: BaseConfig,
    run_dir: Path | str | None = None,
    *,
    resume: bool = False,
    dataset: FederatedDataset | None = None,
    model: ModelSource = None,
    on_round: RoundCallback | None = None,
    stop_after: int | None = None,
    executor_factory: ExecutorFactory | None = None,
) -> RunResult:
    """Run (or resume) one experiment; write its run folder when ``run_dir`` is given.

    ``executor_factory`` builds the executor from the experiment (default: the one the config
    names); the Flower ServerApp passes one that sends clients to its grid.

    ``stop_after`` ends the run after that round (as a kill would, for tests of ``resume``).
    While it runs, the run folder holds a lock (``.lock``, removed at the end, even on errors);
    a second run on the same folder raises :class:`~fedbug.errors.RunFolderBusy`. A run whose
    loss or weights stop being finite raises :class:`~fedbug.errors.DivergenceError` after
    writing ``summary.json`` with ``"status": "diverged"``.
    """
    if run_dir is None:
        with contextlib.ExitStack() as cleanup:  # what the run opens is closed however it ends
            args = (cfg, None, resume, dataset, model, on_round, stop_after, executor_factory)
            return _run(cleanup, *args)
    rd = RunDir(Path(run_dir))
    created = not rd.path.exists()
    rd.create()
    try:
        rd.acquire_lock()
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                rd.path.rmdir()
        raise
    try:
        rd.remove_stale_temps()  # a killed run's half-written files; the lock is ours now
        with contextlib.ExitStack() as cleanup:
            args = (cfg, rd, resume, dataset, model, on_round, stop_after, executor_factory)
            return _run(cleanup, *args)
    finally:
        rd.release_lock()
        if created:
            with contextlib.suppress(OSError):  # only an empty folder: the run wrote nothing
                rd.path.rmdir()


def _run(
    cleanup: contextlib.ExitStack,
    cfg: BaseConfig,
    rd: RunDir | None,
    resume: bool,
    dataset: FederatedDataset | None,
    model: ModelSource,
    on_round: RoundCallback | None,
    stop_after: int | None,
    executor_factory: ExecutorFactory | None = None,
) -> RunResult:
    exp = Experiment(cfg, dataset, model)
    cfg = exp.cfg
    weights = exp.initial_weights()
    server_state = exp.algorithm.init_server_state(weights, exp.num_clients)
    # client state on disk when it could outgrow memory (N clients x a full model of state)
    on_disk = rd is not None and exp.num_clients * exp.space.total * 4 > STATE_STORE_MIN_BYTES
    states = ClientStates(
        exp.algorithm,
        exp.space,
        rd.path / "client_states" if on_disk else None,
        exp.num_clients,
    )
    cleanup.callback(states.close)  # the on-disk store's maps; its files stay for a resume
    sim = Simulation(exp)
    local_mean = (
        LocalModelMean(weights, exp.num_clients)
        if cfg.evaluation == "mean_of_local_models"
        else None
    )
    records: list[dict[str, Any]] = []
    start = 1
    chash = config_hash(cfg)
    if rd is not None:
        if resume and rd.checkpoint_path.exists():
            ck = rd.load_checkpoint()
            if not isinstance(ck, dict) or ck.get("config_hash") != chash:
                found = ck.get("config_hash") if isinstance(ck, dict) else None
                raise CheckpointError(
                    f"checkpoint {str(rd.checkpoint_path)!r} was written by another config "
                    f"({found} vs {chash}); resume with the same config"
                )
            check_checkpoint_fits(ck, rd.checkpoint_path, cfg, weights, server_state, states)
            weights = ck["weights"]
            server_state = ck["server_state"]
            states.load_state_dict(ck["client_states"])
            if local_mean is not None:
                local_mean.load_state_dict(ck["local_models"])
            sim.load_state_dict(ck["simulation"])
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
                    **(
                        {
                            "test_summary": partition_summary(
                                exp.test_parts, exp.dataset.test_y, exp.dataset.num_classes
                            ),
                            "test_clients": [p.tolist() for p in exp.test_parts],
                        }
                        if exp.test_parts is not None
                        else {}
                    ),
                },
            )
            plot_partition(
                exp.parts,
                exp.dataset.train_y,
                exp.dataset.num_classes,
                rd.path / "partition.png",
                f"{cfg.name}: {cfg.partition} partition (seed {cfg.seed})",
                test_parts=exp.test_parts,
                test_labels=exp.dataset.test_y if exp.test_parts is not None else None,
            )
    # workers start only once the run folder is settled (a refused resume starts none)
    if executor_factory is not None:
        executor = executor_factory(exp)
    else:
        executor = build_executor(exp, rd.path if rd is not None else None)
    t_run = time.perf_counter()
    last_round = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
    shared, shared_mask = exp.shared, exp.shared_mask
    model_bytes = exp.space.bytes_of(shared_mask)
    diverged: DivergenceError | None = None
    try:
        for r in range(start, last_round + 1):
            t0 = time.perf_counter()
            clients = exp.selection.select(r, cfg.seed, exp.num_clients)
            payload = exp.algorithm.payload(server_state)
            tasks = [
                ClientTask(
                    r,
                    i,
                    cfg.seed,
                    exp.lr_at(r),
                    exp.mean_samples,
                    payload,
                    cfg.rounds,
                    sim.client_extra(i),
                )
                for i in clients
            ]
            client_states = {i: states.get(i) for i in clients}
            t_train = time.perf_counter()
            results = executor.run_round(weights, tasks, client_states)
            t_train = time.perf_counter() - t_train
            lost = executor.lost()  # clients whose update never came
            results, dropped = screen_updates(exp, r, results)
            dropped = sorted(lost + dropped, key=lambda d: d["client"])
            aggregated = len(results) >= executor.required(len(tasks), cfg.min_results)
            agg = Aggregate(exp.space, cfg.weighting)
            if aggregated:
                for res in results:
                    sent = res.uploaded if cfg.upload == "partial" else shared_mask
                    agg.add(
                        res.delta,
                        sent if cfg.aggregation == "layerwise" else shared_mask,
                        res.num_samples,
                        res.entries,
                        res.extras,
                    )
                    if exp.keeps_client_state:
                        states.put(res.client, res.state)
                    if local_mean is not None:
                        local_mean.update(res.client, weights + res.delta)
                step = exp.algorithm.server_update(weights, agg, server_state, r, exp.num_clients)
                check_weights(exp, r, step.weights)
            else:
                step = ServerStep(weights, weights, server_state)
            down_each = round_bytes(exp, shared, r, model_bytes)
            simulated = sim.finish(r, results, down_each, step.weights - weights) if results else {}
            weights, server_state = step.weights, step.state
            evaluated: dict[str, Any] = {"test_acc": None, "test_loss": None}
            t_eval = 0.0
            if r % cfg.eval_every == 0 or r == cfg.rounds:
                t_eval = time.perf_counter()
                evaluated = evaluate_round(exp, step.eval_weights, local_mean, states)
                t_eval = time.perf_counter() - t_eval
            n = len(results)
            record: dict[str, Any] = {
                "round": r,
                **evaluated,
                "train_loss": sum(x.train_loss for x in results) / n if n else None,
                "clients": [x.client for x in results],
                "num_clients": n,
                "lr": exp.lr_at(r),
                "trained_params": (sum(x.trained_params for x in results) / n if n else None),
                "bytes_down": sum(
                    x.bytes_down if x.bytes_down is not None else down_each for x in results
                ),
                "trained_sublayers": trained_sublayers(exp, r),
                "bytes_up": sum(
                    x.bytes_up if cfg.upload == "partial" else model_bytes for x in results
                ),
                "flops": sum(x.flops for x in results),
                "client_drift": agg.client_drift(),
                **step.metrics,
                **simulated,
                "time_train": t_train,
                "time_eval": t_eval,
                "wall_time": time.perf_counter() - t0,
            }
            if dropped:
                record["dropped"] = dropped
            resets = [x.client for x in results if x.state_reset]
            if resets:  # their node had lost their state (a restarted Flower SuperNode)
                record["state_reset"] = resets
            if not aggregated:
                record["aggregated"] = False
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
                            "simulation": sim.state_dict(),
                            "config_hash": chash,
                        }
                    )
            if on_round is not None:
                on_round(record)
    except DivergenceError as e:
        diverged = e
    finally:
        executor.close()
    summary = make_summary(cfg, records, chash, time.perf_counter() - t_run, exp)
    summary["clients"] = sim.summary()
    summary["weights_sha256"] = weights_sha256(weights)
    if diverged is not None:
        summary["status"] = "diverged"
        summary["divergence"] = {
            "round": diverged.round,
            "client": diverged.client,
            "reason": diverged.reason,
        }
        if rd is not None:
            rd.write_json("summary.json", summary)
            if records:
                plot_run(records, rd.path / "accuracy.png", f"{cfg.name} (seed {cfg.seed})")
        raise diverged
    completed = bool(records) and records[-1]["round"] == cfg.rounds
    if completed and cfg.evaluation == "personalized":
        summary["pfl"] = personalize(exp, weights, states, rd)
    if rd is not None and (not records or completed):
        rd.write_json("summary.json", summary)
        if records:
            plot_run(records, rd.path / "accuracy.png", f"{cfg.name} (seed {cfg.seed})")
    return RunResult(rd.path if rd else None, records, summary, weights)


def weights_sha256(weights: Tensor) -> str:
    """SHA-256 of the flat float32 weights' bytes: equal hashes, bitwise equal models."""
    return hashlib.sha256(
        weights.detach().to(torch.float32).contiguous().numpy().tobytes()
    ).hexdigest()


def screen_updates(
    exp: Experiment, round: int, results: list[ClientResult]
) -> tuple[list[ClientResult], list[dict[str, Any]]]:
    """The updates that may be aggregated, and ``{"client", "reason"}`` for each one dropped.

    A malformed update is always dropped; a non-finite one (loss or delta) raises
    :class:`DivergenceError` under ``on_divergence: stop`` and is dropped under ``skip_client``.
    """
    kept: list[ClientResult] = []
    dropped: list[dict[str, Any]] = []
    for res in results:
        reason = check_update(res, exp.space)
        if reason is None:
            kept.append(res)
            continue
        if is_divergence(reason) and exp.cfg.on_divergence == "stop":
            raise DivergenceError(
                f"training diverged in round {round}: client {res.client}'s update has {reason}; "
                f"{divergence_hint(exp.cfg)}",
                round,
                res.client,
                reason,
            )
        dropped.append({"client": res.client, "reason": reason})
    return kept, dropped


def check_weights(exp: Experiment, round: int, weights: Tensor) -> None:
    """Stop when the aggregated weights are not finite (whatever ``on_divergence`` says: no
    single client can be dropped for it)."""
    if bool(torch.isfinite(weights).all()):
        return
    bad = int((~torch.isfinite(weights)).sum())
    reason = f"non-finite global weights after aggregation ({bad} of {weights.numel()} entries)"
    raise DivergenceError(
        f"training diverged in round {round}: {reason}; {divergence_hint(exp.cfg)}",
        round,
        None,
        reason,
    )


def evaluate_round(
    exp: Experiment, eval_weights: Tensor, local_mean: LocalModelMean | None, states: ClientStates
) -> dict[str, Any]:
    """The round's test figures for the config's ``evaluation`` (plus each client's own test
    accuracy under the global model where clients have test sets: FreezeFL's acc_client_mean)."""
    if exp.cfg.evaluation == "personalized":
        figures = client_figures(exp, eval_weights, states.get)
        return {"test_acc": figures["acc_client_mean"], "test_loss": None, **figures}
    out: dict[str, Any]
    if local_mean is not None:
        acc, loss = exp.evaluator.evaluate(local_mean.mean())
        acc_s, loss_s = exp.evaluator.evaluate(eval_weights)
        out = {"test_acc": acc, "test_loss": loss, "test_acc_server": acc_s}
        out["test_loss_server"] = loss_s
    else:
        acc, loss = exp.evaluator.evaluate(eval_weights)
        out = {"test_acc": acc, "test_loss": loss}
    if exp.personal is not None:
        out.update(client_figures(exp, eval_weights, lambda _client: {}, generic=True))
    return out


def client_figures(
    exp: Experiment,
    weights: Tensor,
    states: Callable[[int], dict[str, Tensor]],
    generic: bool = False,
) -> dict[str, Any]:
    """Mean, std (over clients) and weighted accuracy of every client on its own test set
    (``generic``: the global model's own output, without any personal part)."""
    figures = summarise_scores(exp.personal.evaluate(weights, states, generic=generic))
    return {
        "acc_client_mean": figures["mean"],
        "acc_client_std": figures["std"],
        "acc_client_weighted": figures["weighted"],
    }


def personalize(
    exp: Experiment, weights: Tensor, states: ClientStates, rd: RunDir | None
) -> dict[str, Any]:
    """After the last round: every client's accuracy before and after fine-tuning on its own
    data (FedSeq Algorithm 1, lines 20-26); writes clients.csv and clients.png."""
    cfg = exp.cfg
    before = exp.personal.evaluate(weights, states.get)
    settings = FinetuneSettings(
        epochs=cfg.finetune_epochs,
        lr=cfg.finetune_lr if cfg.finetune_lr is not None else cfg.lr,
        momentum=cfg.finetune_momentum,
        weight_decay=cfg.weight_decay,
        batch_size=cfg.batch_size,
    )
    after = exp.personal.finetune(weights, states.get, settings, cfg.seed)
    block = pfl_summary(before, after)
    if rd is not None:
        atomic_write_text(rd.path / "clients.csv", clients_csv(block))
        plot_clients(block, rd.path / "clients.png", f"{cfg.name}: each client's own accuracy")
    return block


def round_bytes(exp: Experiment, shared: set[int], round: int, model_bytes: int) -> int:
    """Bytes a client downloads: the shared units, less (under a FedSeq schedule) the base
    sub-layers not yet unfrozen, whose initial values every client already holds."""
    if exp.schedule is None:
        return model_bytes
    sent = set(exp.schedule.round_units(round)) | (shared - exp.schedule.base_units)
    return exp.space.bytes_of([u in shared and u in sent for u in range(exp.space.num_units)])


def trained_sublayers(exp: Experiment, round: int) -> list[int]:
    """The base sub-layers (1-based, input to output) scheduled in ``round``: all without a
    schedule."""
    if exp.schedule is None:
        return list(range(1, len(exp.layout.sublayers) + 1))
    return exp.schedule.trained_sublayers(round)


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
