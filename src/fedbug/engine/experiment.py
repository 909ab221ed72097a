"""Building an experiment from a config: :class:`ClientSide` (what every client needs: data,
partition, model units, algorithm, policy, settings) and :class:`Experiment` (the server's
parts on top: simulated system, selection, evaluators)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedbug.algorithms import Algorithm, build_algorithm
from fedbug.config import BaseConfig, resolve
from fedbug.core.device import (
    check_precision,
    configure_kernels,
    default_threads,
    resolve_device,
)
from fedbug.core.flops import LossFn, training_flops
from fedbug.core.seeding import derive_seed
from fedbug.core.tasks import Task, build_task
from fedbug.data import FederatedDataset, load_dataset, partition
from fedbug.data.augment import AUGMENTATIONS, Augmentation
from fedbug.data.targets import ONE_POSITION_FIX, every_position_targets
from fedbug.engine.build import build_parts
from fedbug.engine.client import (
    ClientData,
    ClientRuntime,
    TrainSettings,
    with_memory_format,
)
from fedbug.engine.client_task import lr_at, mean_samples
from fedbug.engine.counting import counting_loss
from fedbug.engine.dataprep import (
    natural_clients,
    personal_test_sets,
    place_on_device,
    subsample,
)
from fedbug.engine.evaluate import Evaluator
from fedbug.engine.model_fit import check_model_fits
from fedbug.engine.pfl import (
    PersonalizedEvaluator,
)
from fedbug.engine.privacy.sample_level import refuse_unsupported, sample_dp
from fedbug.errors import ConfigError
from fedbug.models import build_model, model_kwargs
from fedbug.selection import SELECTIONS
from fedbug.system import SystemModel, UnitCosts, per_sample_costs

ModelSource = nn.Module | Callable[[], nn.Module] | None


class ClientSide:
    """What clients need, built once from a config (and optionally a user's model and data):
    the data and its partition, the model template cut into units, the algorithm, the freeze
    policy and the local-training settings. A worker process or Flower node builds only this;
    :class:`Experiment` adds the server's parts."""

    def __init__(
        self,
        cfg: BaseConfig,
        dataset: FederatedDataset | None = None,
        model: ModelSource = None,
        task: Task | str | None = None,
    ) -> None:
        auto_threads = cfg.threads is None and cfg.executor == "sequential"
        cfg = self._task_and_device(resolve(cfg), task)
        # what worker processes rebuild the experiment from
        self.sources = (dataset, model, task)
        data_dir = Path(cfg.data_dir).expanduser() if cfg.data_dir else None
        ds = (
            dataset
            if dataset is not None
            else load_dataset(cfg.dataset, data_dir, cfg.dataset_options, cfg.num_clients)
        )
        self.cfg = cfg = with_user_sources(cfg, dataset, model)
        check_labels(self.task, ds, cfg)
        check_augment(ds, cfg)
        ds = self.dataset = self._deal(ds, cfg)
        check_test_set(ds, cfg)
        self.num_clients = len(self.parts)
        blocks = {name: cfg.options(name) for name in type(cfg).model_fields}
        self.algorithm: Algorithm = build_algorithm(cfg.algorithm, cfg.global_lr, blocks, self.task)
        if cfg.evaluation != "personalized" and not self.algorithm.has_global_model:
            raise ConfigError(
                f"{cfg.algorithm} keeps part of every model on its client, so there is no global "
                f"model to evaluate (evaluation: {cfg.evaluation}); use evaluation: personalized"
            )
        example = self.example = ds.prepare(ds.train_x[:2])
        model = self._build_model(model)
        self._check_model(model, example, ds, cfg)
        if auto_threads and self.device.type == "cpu":  # by the model's work a step
            self.cfg = cfg = self._pick_threads(model, example, ds, cfg)
        self.model_class = type(model)
        if cfg.dp_sgd is not None:
            refuse_unsupported(model)  # before anything is built on it: Opacus's validator
        parts = build_parts(cfg, self.algorithm, model, example)
        self.classifier, self.template = parts.classifier, parts.template
        self.units, self.space, self.layout = parts.units, parts.space, parts.layout
        # the units the server and clients exchange (the rest stay on each client)
        self.shared_mask = parts.shared_mask
        self.shared = {u for u, s in enumerate(self.shared_mask) if s}
        # freeze policies see the model's own units, not those an algorithm adds (as the client)
        self.policy_units = parts.policy_units
        self.policy = parts.policy  # with FedSeq's round schedule, where there is one
        self.settings = train_settings(cfg)
        sizes = [len(p) for p in self.parts]
        self.sizes = sizes
        self.mean_samples = mean_samples(sizes)
        # what clients and evaluation read: on a GPU the data set uploaded once where it fits
        self.device_dataset, self.data_placement = place_on_device(
            self.dataset, self.device, cfg.device_data_share
        )

    def _task_and_device(self, cfg: BaseConfig, task: Task | str | None) -> BaseConfig:
        """The run's task (``self.task``) and device (``self.device``, this process's kernels
        claimed for it), refusing what cannot run; the config naming the task built."""
        if task is None and cfg.task == "custom":
            raise ConfigError(
                "task: custom needs the task itself: fedbug.run(cfg, task=...) or "
                "fedbug.run(cfg, loss=..., metrics=...)"
            )
        self.task = build_task(task if task is not None else cfg.task)
        # worker processes train on the CPU: there ``auto`` means the CPU
        cpu_only = cfg.executor == "processes" and cfg.device == "auto"
        self.device = resolve_device("cpu" if cpu_only else cfg.device)
        check_precision(self.device, cfg.precision)
        if cfg.executor == "processes" and self.device.type != "cpu":
            raise ConfigError(
                f"executor: processes runs its workers on the CPU; with device: {cfg.device} "
                "use executor: sequential (one process drives the GPU)"
            )
        if self.task.name != cfg.task:
            cfg = cfg.model_copy(update={"task": self.task.name})
        self.kernels = claim_process(self.device, cfg)
        return cfg

    def _deal(self, ds: FederatedDataset, cfg: BaseConfig) -> FederatedDataset:
        """The data set subsampled, dealt to the clients (``self.parts``) with their own test
        samples where evaluated per client (``self.test_parts``: indices into the returned data
        set's test_x / test_y; for personalized evaluation, and for acc_client_mean beside a
        global model when clients have their own test samples, LEAF's, or pfl_test is set),
        and its training targets at every position under ``targets: every``."""
        if cfg.subsample < 1.0:
            ds = subsample(ds, cfg.subsample)
        if cfg.partition == "natural":
            self.parts, ds = natural_clients(ds, cfg.num_clients, cfg.seed)
        else:
            labels, num_classes = class_labels(ds)
            self.parts = partition(
                labels,
                cfg.num_clients,
                cfg.partition,
                cfg.alpha,
                cfg.seed,
                cfg.unbalanced_sigma,
                num_classes,
                cfg.min_client_samples,
            )
        self.test_parts: list[Tensor] | None = None
        natural_tests = cfg.partition == "natural" and ds.natural_test_clients is not None
        if cfg.evaluation == "personalized" or cfg.pfl_test is not None or natural_tests:
            self.parts, self.test_parts, ds = personal_test_sets(ds, self.parts, cfg)
        if cfg.targets == "every":  # after the partition, which deals samples by label
            ds = every_position_targets(ds)
        return ds

    def _check_model(
        self, model: nn.Module, example: Tensor, ds: FederatedDataset, cfg: BaseConfig
    ) -> None:
        """Refuse a model that does not fit the data (:func:`check_model_fits`), naming
        ``targets: every`` where the model scores one position only."""
        try:
            check_model_fits(model, example, ds.train_y[:2], ds, self.task)
        except ConfigError as e:
            if cfg.targets != "every":
                raise
            raise ConfigError(f"{e} ({ONE_POSITION_FIX})") from None

    def _pick_threads(
        self, model: nn.Module, example: Tensor, ds: FederatedDataset, cfg: BaseConfig
    ) -> BaseConfig:
        """The config with the torch threads a step of this model's work needs (threads left to
        the machine on a sequential run), set for this process."""
        flops = step_flops(model, example, ds.train_y[:2], self.task.loss, cfg.batch_size)
        threads = default_threads(flops, resolved_threads(cfg))
        if threads == cfg.threads:
            return cfg
        torch.set_num_threads(threads)
        return cfg.model_copy(update={"threads": threads})

    def provenance(self) -> dict[str, Any]:
        """What this run trained on, as its summary records it: the data set's name, shapes and
        label kind, the model's class (module and qualified name)."""
        ds = self.dataset
        cls = self.model_class
        return {
            "data": {
                "name": ds.name,
                "train": list(ds.train_x.shape),
                "test": list(ds.test_x.shape),
                "num_classes": ds.num_classes,
                "labels": ds.labels,
            },
            "model_class": f"{cls.__module__}.{cls.__qualname__}",
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled (a Flower node's cached client side, in a new process): that process gets
        the settings building it would have given (threads, GPU kernels)."""
        self.__dict__.update(state)
        self.kernels = claim_process(self.device, self.cfg)

    def _build_model(self, model: ModelSource) -> nn.Module:
        ds, cfg = self.dataset, self.cfg
        if model is None:
            return build_model(
                cfg.model, ds.input_shape, ds.num_classes, cfg.seed, **model_kwargs(cfg)
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
        return self.device_dataset.client_data(self.parts[client])

    def augmentation(self) -> Augmentation | None:
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
            device=self.device,
            precision=self.cfg.precision,
        )

    def initial_weights(self) -> Tensor:
        return self.space.flatten(self.template)


class Experiment(ClientSide):
    """Everything a run needs: the clients' side plus the server's (the simulated system, the
    selection, evaluation)."""

    def __init__(
        self,
        cfg: BaseConfig,
        dataset: FederatedDataset | None = None,
        model: ModelSource = None,
        task: Task | str | None = None,
    ) -> None:
        super().__init__(cfg, dataset, model, task)
        cfg, ds, example, policy_units = self.cfg, self.dataset, self.example, self.policy_units
        sizes = self.sizes
        self.system: SystemModel | None = None
        #: what the algorithm made of the simulated system, for the summary (setup_system)
        self.system_figures: dict[str, Any] = {}
        if cfg.system is not None:
            labels = ds.train_y[: len(example)]
            # the loss a client trains with, as fedbug cost counts it
            loss = counting_loss(cfg, self.algorithm, labels, self.mean_samples)
            costs = per_sample_costs(
                cfg.system, copy.deepcopy(self.template), self.units, example, labels, loss
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
                unit_costs=self._unit_costs(example, labels, loss),
            )
            self.system_figures = self.algorithm.setup_system(
                self.system, copy.deepcopy(self.template), example, labels
            )
        self.policy.setup_server(self.system, cfg)
        self.selection = SELECTIONS.get(cfg.resolved_selection()).build(
            cfg, self.num_clients, self.system
        )
        self.evaluator = Evaluator(
            self.template,
            self.space,
            self.device_dataset,
            cfg.eval_batch_size,
            cfg.memory_format,
            self.task,
            device=self.device,
            precision=cfg.precision,
        )
        self.personal: PersonalizedEvaluator | None = None
        if self.test_parts is not None:
            self.personal = PersonalizedEvaluator(
                self.template,
                self.space,
                self.algorithm,
                self.device_dataset,
                self.parts,
                self.test_parts,
                cfg.eval_batch_size,
                self.augmentation(),
                cfg.memory_format,
                device=self.device,
                precision=cfg.precision,
                cfg=cfg,
            )

    def _unit_costs(self, example: Tensor, labels: Tensor, loss: LossFn) -> UnitCosts | None:
        """Costs of any trained unit set, counted on demand (a policy's blocks), in FLOPs:
        under ``cost: measured`` none (a timed set would differ on a resume)."""
        if self.cfg.system is None or self.cfg.system.cost != "flops":
            return None
        always = range(self.policy_units, len(self.units))  # an algorithm's own units
        return UnitCosts(copy.deepcopy(self.template), self.units, example, labels, loss, always)

    def lr_at(self, round: int) -> float:
        return lr_at(self.cfg, round)


def with_user_sources(
    cfg: BaseConfig, dataset: FederatedDataset | None, model: ModelSource
) -> BaseConfig:
    """The config naming a user's own data set and model (``user:<name>``, ``user:<module.
    class>``) instead of the defaults it was not run on, so config.yaml and summary.json say
    what the run used."""
    update: dict[str, Any] = {}
    if dataset is not None and not cfg.dataset.startswith("user:"):
        update["dataset"] = f"user:{dataset.name}"
    if model is not None and not cfg.model.startswith("user:"):
        # a module: its class; a class or a factory function: itself
        target = type(model) if isinstance(model, nn.Module) else model
        update["model"] = f"user:{target.__module__}.{target.__qualname__}"
    return cfg.model_copy(update=update) if update else cfg


def check_augment(ds: FederatedDataset, cfg: BaseConfig) -> None:
    """Refuse an image augmentation named for a data set of anything else: token sequences (a
    flip would reverse each sequence, and ``targets: every``'s targets would no longer follow
    it) or feature vectors (no left and right to flip); and a crop of samples that are not
    (C, H, W) images."""
    if cfg.augment in ("auto", "none"):
        return
    if ds.inputs != "image":
        what = "token sequences" if ds.inputs == "tokens" else "feature vectors"
        raise ConfigError(
            f"augment: {cfg.augment} transforms images, and data set {ds.name!r} holds {what}; "
            "use augment: none (or auto)"
        )
    if cfg.augment == "crop_flip" and ds.train_x.dim() != 4:
        shape = tuple(ds.train_x.shape[1:])
        raise ConfigError(
            f"augment: crop_flip crops (C, H, W) images, and data set {ds.name!r}'s samples are "
            f"shaped {shape}; use augment: flip or none, or give the images a channel axis"
        )


def train_settings(cfg: BaseConfig) -> TrainSettings:
    """A client's local-training settings, from the config."""
    return TrainSettings(
        local_epochs=cfg.local_epochs,
        local_steps=cfg.local_steps,
        batch_size=cfg.batch_size,
        optimizer=cfg.optimizer,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        clip_grad_norm=cfg.clip_grad_norm,
        count_flops=cfg.count_flops,
        dp_sgd=sample_dp(cfg),
        upload=cfg.upload,
    )


def class_labels(ds: FederatedDataset) -> tuple[Tensor, int]:
    """The labels a partition deals by class and their number: the data set's own for class
    labels (a sequence's own target where ``targets: every`` gave it one at every position:
    the last); one class (all zeros) for values (regression targets), which only iid and natural
    partitions accept."""
    if ds.labels == "classes":
        y = ds.train_y
        return (y[:, -1].long() if y.dim() == 2 else y), ds.num_classes
    return torch.zeros(len(ds.train_y), dtype=torch.long), 1


def check_test_set(ds: FederatedDataset, cfg: BaseConfig) -> None:
    """Refuse a run whose test set is empty: every round scores the model on it."""
    if len(ds.test_x):
        return
    if cfg.partition == "natural" and ds.natural_test_clients is not None:
        raise ConfigError(
            f"the {cfg.num_clients} natural client(s) of {ds.name!r} this run draws (seed "
            f"{cfg.seed}) have no test samples, so no round could score the model; use more "
            "clients (num_clients), give these clients test samples, or set pfl_test: holdout "
            "to score it on a share of each client's train samples"
        )
    raise ConfigError(
        f"data set {ds.name!r} has no test samples (test_x is empty), so no round could score "
        "the model; give test samples (test_x, test_y), or set pfl_test: holdout to score it "
        "on a share of each client's train samples"
    )


def check_labels(task: Task, ds: FederatedDataset, cfg: BaseConfig) -> None:
    """Refuse a task the data set's labels cannot serve, and class-based partitions of values."""
    if task.labels not in ("any", ds.labels):
        raise ConfigError(
            f"task {task.name} needs a data set with labels: {task.labels}, but "
            f"{ds.name!r} has labels: {ds.labels}; choose another task or data set"
        )
    if ds.labels == "values" and cfg.partition in ("dirichlet", "dirichlet_classwise"):
        raise ConfigError(
            f"partition: {cfg.partition} deals classes, but {ds.name!r} has labels: values "
            "(regression targets); use partition: iid or natural"
        )


def step_flops(
    model: nn.Module, x: Tensor, y: Tensor, loss: Callable[[Any, Tensor], Tensor], batch_size: int
) -> float | None:
    """FLOPs of one training step of ``batch_size`` samples, scaled from ``x`` (on a copy of the
    model); None where the counter cannot follow the model."""
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    try:
        flops = training_flops(copy.deepcopy(model), trainable, x, y, loss)
    except (RuntimeError, ValueError, TypeError):
        return None
    return flops / max(1, len(x)) * batch_size


def claim_process(device: torch.device, cfg: BaseConfig) -> dict[str, Any]:
    """Set what clients compute under in this process: torch's thread count and, on a GPU, its
    kernel flags (:func:`~fedbug.core.device.configure_kernels`, whose record is returned)."""
    torch.set_num_threads(resolved_threads(cfg))
    return configure_kernels(device, cfg.precision, cfg.deterministic)


def resolved_threads(cfg: BaseConfig) -> int:
    """The config's torch threads, which :func:`fedbug.config.loading.resolve` filled (every
    config an experiment holds is resolved)."""
    assert cfg.threads is not None, "the config's threads are not resolved"
    return cfg.threads
