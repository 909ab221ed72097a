"""The config's keys: :class:`BaseConfig`, every experiment's fields with their bounds and the
checks across them, and :func:`config_class`, BaseConfig plus one options block per registered
method that has a ``params_cls``."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from fedbug.algorithms import ALGORITHMS
from fedbug.config.cohort import CohortParams
from fedbug.config.compat import check_compatible
from fedbug.config.dp import DPParams, DPSGDParams
from fedbug.core.paths import expand_user
from fedbug.core.registry import unknown_name_message as _unknown
from fedbug.core.tasks import TASKS
from fedbug.data import DATASETS
from fedbug.data.augment import AUGMENTATIONS
from fedbug.errors import FedbugError
from fedbug.integrations.flower.params import FlowerParams
from fedbug.integrations.tracking import check_available, check_tracking_uri
from fedbug.models import MODELS, import_model, is_hf, is_import_path
from fedbug.models.adapters import AdapterParams
from fedbug.models.hf import check_hf_model
from fedbug.policies import POLICIES
from fedbug.selection import SELECTIONS
from fedbug.system import SystemParams


def _numeric(annotation: Any) -> bool:
    """Whether a field's type takes numbers and not booleans (int, float, optionally None)."""
    kinds = set(get_args(annotation)) or {annotation}
    return bool(kinds & {int, float, "int", "float"}) and bool not in kinds


class BaseConfig(BaseModel):
    """The fields every experiment has. See the README's config reference."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """``rounds: true`` is no round count: pydantic would take a boolean as 1 (or 0) for
        an int or float field."""
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key)
                if isinstance(value, bool) and field is not None and _numeric(field.annotation):
                    raise ValueError(f"{key}={str(value).lower()} is a boolean; give a number")
        return data

    name: str = Field("experiment", min_length=1, max_length=120, pattern=r"^[\w.+-]+$")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    # data
    dataset: str = "digits"
    dataset_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of a generated data set (synthetic)"
    )
    data_dir: str | None = None
    subsample: float = Field(
        1.0, gt=0.0, le=1.0, description="share of the training set kept (CPU-scale twins)"
    )
    num_clients: int = Field(20, ge=1, le=10_000_000)
    partition: Literal["iid", "dirichlet", "dirichlet_classwise", "natural"] = "dirichlet"
    min_client_samples: int = Field(
        10, ge=0, le=1_000_000, description="dirichlet_classwise redraws until each has this many"
    )
    alpha: float = Field(0.3, gt=0.0, le=1e9, description="Dirichlet concentration")
    unbalanced_sigma: float = Field(0.0, ge=0.0, le=10.0)
    augment: str = Field("auto", description="auto (the data set's own), none, flip, crop_flip")
    # model
    model: str = "digits_cnn"
    model_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of the model builder"
    )
    units: list[str | list[str]] | Literal["blocks"] | None = Field(
        None,
        description="unit names in order; blocks: embedding, each repeated block, head "
        "(fedbug.core.blocks); default: one unit per traced layer",
    )
    hf_config: dict[str, Any] | None = Field(
        None,
        description="model: hf: a Hugging Face config from keys ({model_type: gpt2, n_layer: "
        "2, ...}), randomly initialised; beside hf:<name>, keys overriding its saved config",
    )
    adapters: AdapterParams | None = Field(
        None,
        description="LoRA adapters on a Hugging Face model ({kind: lora, r: 8, targets: [...]}):"
        " only they train and travel; units default to blocks (fedbug.models.adapters)",
    )
    head_units: int = Field(1, ge=0, le=10_000, description="the last units form the head")
    sublayers: int | list[list[str]] | None = Field(
        None, description="base sub-layers: one per base unit, K groups, or unit-name groups"
    )
    # local training
    rounds: int = Field(30, ge=1, le=1_000_000)
    local_epochs: int = Field(5, ge=1, le=10_000)
    local_steps: int | None = Field(None, ge=1, le=10_000_000)
    batch_size: int = Field(50, ge=1, le=1_000_000)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.1, gt=0.0, le=1e6)
    lr_decay: float = Field(1.0, gt=0.0, le=1.0, description="lr *= lr_decay each round")
    weight_decay: float = Field(1e-3, ge=0.0, le=1.0)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    clip_grad_norm: float | None = Field(None, gt=0.0)
    # federation
    method: str | None = Field(None, description="a preset (see config.PRESETS) or algorithm")
    algorithm: str = "fedavg"
    global_lr: float = Field(1.0, gt=0.0, le=1e3)
    policy: str = "none"
    schedule: Literal["none", "vanilla", "anti"] = Field(
        "none", description="FedSeq round schedule of the base sub-layers"
    )
    unfreeze_rounds: list[int] | None = Field(
        None, description="FedSeq's t_1..t_K (default floor((k-1)T/K))"
    )
    participation: float = Field(0.1, gt=0.0, le=1.0)
    clients_per_round: int | None = Field(None, ge=1)
    selection: str | None = None
    system: SystemParams | None = Field(None, description="simulated devices (FreezeFL Sec. V-A)")
    weighting: Literal["samples", "uniform"] = "samples"
    aggregation: Literal["layerwise", "full"] = Field(
        "layerwise",
        description="layerwise: each unit averaged over the clients that sent it (FreezeFL Eq. 4);"
        " full: over all participants, an unsent unit counting as unchanged",
    )
    upload: Literal["partial", "full"] = Field(
        "partial", description="partial: only trained units are sent; full: every shared unit"
    )
    # evaluation and output
    evaluation: Literal["global", "mean_of_local_models", "personalized"] = "global"
    task: str = Field(
        "classification",
        description="classification, regression, multilabel, next_token (fedbug.core.tasks); "
        "custom: a task object given to fedbug.run",
    )
    targets: Literal["last", "every"] = Field(
        "last",
        description="next_token: the token after each sequence (last, LEAF's target) or after "
        "each position (every: a causal LM trained on every position; needs token inputs)",
    )
    pfl_test: Literal["matched", "holdout"] | None = Field(
        None,
        description="client test sets: the official test set dealt (matched, the default of "
        "personalized evaluation) or a holdout of each client's train part; when set with global "
        "evaluation, acc_client_mean is recorded too",
    )
    test_fraction: float = Field(
        0.25, gt=0.0, lt=1.0, description="share of each client's train part held out (holdout)"
    )
    finetune_epochs: int = Field(10, ge=0, le=10_000, description="personalized: F")
    finetune_lr: float | None = Field(None, gt=0.0, le=1e6, description="default: lr")
    finetune_momentum: float = Field(0.0, ge=0.0, lt=1.0)
    eval_every: int = Field(1, ge=1)
    eval_batch_size: int = Field(
        100, ge=1, le=1_000_000, description="100: fastest on W (benchmarks/RESULTS.md)"
    )
    checkpoint_every: int = Field(10, ge=1)
    count_flops: bool = True
    threads: int | None = Field(
        None, ge=1, le=1024, description="torch threads (per worker under executor: processes)"
    )
    workers: int = Field(2, ge=1, le=1024, description="worker processes (executor: processes)")
    memory_format: Literal["contiguous", "channels_last"] = Field(
        "channels_last",
        description="layout of image batches: channels_last makes oneDNN run conv models' "
        "convolutions and pooling in NHWC (on W: training 1.28x, evaluation 2.5x faster than "
        "contiguous; equal within float32 rounding)",
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:[0-9]+)?|mps)$",
        description="where models and batches live: auto (CUDA if torch sees it, else CPU), "
        "cpu, cuda, cuda:N, mps; not in the config hash",
    )
    device_data_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="on a GPU, upload the whole data set once for the run when it takes at most "
        "this share of the device's memory (0: never; each client's samples then move per "
        "round); not in the config hash",
    )
    precision: Literal["fp32", "tf32", "bf16", "fp16"] = Field(
        "fp32",
        description="fp32: IEEE float32 throughout (TensorFloat-32 off on a GPU); tf32: "
        "TensorFloat-32 products and convolutions (NVIDIA GPUs); bf16, fp16: the forward pass "
        "and loss under autocast (master weights stay fp32; fp16 on a GPU only)",
    )
    deterministic: bool = Field(
        True,
        description="on a GPU: deterministic kernels (cuDNN without autotuning, PyTorch's "
        "deterministic implementations, cuBLAS's reproducible workspace), so the same config "
        "and seed give the same numbers; false lets cuDNN autotune (faster, numbers vary in "
        "the last bits); not in the config hash",
    )
    executor: Literal[
        "sequential", "processes", "cohort", "flower-simulation", "flower-deployment"
    ] = Field(
        "sequential",
        description="where clients train: this process (sequential), worker processes, a "
        "round's clients as one vectorised step in this process (cohort: equal within float32 "
        "rounding), or Flower (pip install 'fedbug[flower]'); the others give the same numbers",
    )
    cohort: CohortParams = Field(
        default_factory=CohortParams, description="executor: cohort's settings"
    )
    flower: FlowerParams = Field(
        default_factory=FlowerParams, description="the Flower executors' settings"
    )
    record_updates: list[int] = Field(
        default_factory=list,
        description="rounds whose received client updates (and, for scoring, the clients' true "
        "inputs) are written to the run folder's updates/ for `fedbug attack`; never by default",
    )
    tracking: list[Literal["tensorboard", "mlflow"]] = Field(
        default_factory=list,
        description="also write each round to TensorBoard and/or MLflow (pip install "
        "'fedbug[track]')",
    )
    tracking_uri: str | None = Field(
        None, description="MLflow's tracking URI (default: a local store, mlruns/ beside the run)"
    )
    dp: DPParams | None = Field(
        None,
        description="client-level differential privacy (DP-FedAvg): clip, noise_multiplier, "
        "delta, adaptive (pip install 'fedbug[dp]')",
    )
    dp_sgd: DPSGDParams | None = Field(
        None,
        description="sample-level DP-SGD on each client (Opacus's per-sample gradients): clip, "
        "noise_multiplier, delta, sampling (pip install 'fedbug[dp]')",
    )
    # reliability
    on_divergence: Literal["stop", "skip_client"] = Field(
        "stop", description="a non-finite loss or update: stop the run, or drop that client"
    )
    min_results: int = Field(
        1,
        ge=1,
        le=10_000_000,
        description="fewer valid updates in a round: the round is short (see on_short_round)",
    )
    on_short_round: Literal["stop", "skip"] = Field(
        "stop",
        description="a round with fewer than min_results valid updates (clients that timed out, "
        "failed or sent malformed ones): stop the run (exit 3), or skip the round (not "
        "aggregated, listed in the summary) and go on; a run no round trained never completes",
    )
    # sweeps
    grid: dict[str, list[Any]] | None = None
    seeds: int = Field(1, ge=1, le=1000)

    @field_validator("data_dir")
    @classmethod
    def _data_dir_home(cls, v: str | None) -> str | None:
        """A ``~user`` that names no home folder, refused when the config is read (the data
        loaders expand it)."""
        if v is not None:
            try:
                expand_user(v, "data_dir")
            except FedbugError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("units", mode="before")
    @classmethod
    def _units_shape(cls, v: Any) -> Any:
        """One line for a value of no form (pydantic would list each union branch)."""

        def names(x: Any) -> bool:
            return isinstance(x, str) or (
                isinstance(x, list | tuple) and all(isinstance(n, str) for n in x)
            )

        if v is None or v == "blocks" or (isinstance(v, list | tuple) and all(map(names, v))):
            return v
        raise ValueError(
            f"units: blocks, or a list of unit names, each a layer name or a list of them "
            f"([conv1, [conv2, fc1], fc2]); got {v!r}"
        )

    @model_validator(mode="after")
    def _check(self) -> BaseConfig:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(
                _method_named("algorithm", self.algorithm)
                or _unknown("algorithm", self.algorithm, ALGORITHMS.names())
            )
        if self.augment != "auto" and self.augment not in AUGMENTATIONS:
            raise ValueError(_unknown("augment", self.augment, ["auto", *AUGMENTATIONS.names()]))
        if is_import_path(self.model):
            import_model(self.model)  # a ValueError saying what is wrong
        elif self.model not in MODELS and not is_hf(self.model):
            raise ValueError(_unknown("model", self.model, [*MODELS.names(), "hf", "hf:<name>"]))
        try:
            check_hf_model(self.model, self.hf_config, self.task, self.adapters)
        except FedbugError as e:
            raise ValueError(str(e)) from None
        if self.dataset not in DATASETS:
            raise ValueError(_unknown("dataset", self.dataset, DATASETS.names()))
        if self.policy not in POLICIES:
            raise ValueError(
                _method_named("policy", self.policy)
                or _unknown("policy", self.policy, POLICIES.names())
            )
        if self.selection is not None and self.selection not in SELECTIONS:
            raise ValueError(_unknown("selection", self.selection, SELECTIONS.names()))
        if self.task != "custom" and self.task not in TASKS:
            raise ValueError(_unknown("task", self.task, [*TASKS.names(), "custom"]))
        if self.clients_per_round is not None and self.clients_per_round > self.num_clients:
            raise ValueError(
                f"clients_per_round={self.clients_per_round} exceeds num_clients="
                f"{self.num_clients}; lower it or add clients"
            )
        check_compatible(self)
        bad = [r for r in self.record_updates if not 1 <= r <= self.rounds]
        if bad:
            raise ValueError(f"record_updates: round {bad[0]} is not in 1..{self.rounds}")
        if self.tracking:
            check_available(self.tracking)
        if self.tracking_uri is not None:
            try:
                check_tracking_uri(self.tracking_uri)
            except FedbugError as e:
                raise ValueError(str(e)) from None
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its state, read back as an instance of :func:`config_class` where it is
        unpickled: the class of a config that holds the block of a method registered after
        import (a user's, ``--import``) is built then, and is not ``schema.Config`` by name."""
        return (_unpickle_config, (self.__getstate__(),))

    def options(self, name: str) -> Any:
        """The options block named ``name`` (a method's ``params_cls``), None if it has none."""
        return self.__dict__.get(name)

    def resolved_selection(self) -> str:
        if self.selection:
            return self.selection
        return "uniform" if self.clients_per_round is not None else "bernoulli"


def _unpickle_config(state: dict[str, Any]) -> BaseConfig:
    """A pickled config (:meth:`BaseConfig.__reduce__`) as the config class of the methods
    registered here (its state, read first, imported the modules of the classes it holds)."""
    cls = config_class()
    cfg = cls.__new__(cls)
    cfg.__setstate__(state)
    return cfg


def _build_config_class() -> type[BaseConfig]:
    """BaseConfig plus one options block per algorithm, policy and selection that has a
    ``params_cls``, named after it (``fedprox:``, ``bottom_up:``, ``reputation:``)."""
    blocks: dict[str, Any] = {}
    for registry in (ALGORITHMS, POLICIES, SELECTIONS):
        for name, cls in registry.items():
            if cls.params_cls is not None:
                blocks[name] = (cls.params_cls, Field(default_factory=cls.params_cls))
    return create_model("Config", __base__=BaseConfig, **blocks)


def _blocks_key() -> tuple[str, ...]:
    return tuple(
        f"{kind}:{name}:{id(cls.params_cls)}"
        for kind, registry in (("a", ALGORITHMS), ("p", POLICIES), ("s", SELECTIONS))
        for name, cls in registry.items()
        if cls.params_cls is not None
    )


Config = _build_config_class()
_CONFIG_FOR: dict[tuple[str, ...], type[BaseConfig]] = {_blocks_key(): Config}


def config_class() -> type[BaseConfig]:
    """The config class for the methods registered now: a method registered after import (a
    user's own algorithm or policy) brings its options block with it."""
    key = _blocks_key()
    if key not in _CONFIG_FOR:
        _CONFIG_FOR[key] = _build_config_class()
    return _CONFIG_FOR[key]


def all_keys(model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """Every valid dotted key, for 'did you mean' hints."""
    model = model if model is not None else config_class()
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        ann = field.annotation
        for t in (ann, *get_args(ann)):  # a block, or an optional block (system: ... | None)
            if isinstance(t, type) and issubclass(t, BaseModel):
                keys += all_keys(t, prefix + name + ".")
                break
    return keys


def _method_named(kind: str, name: str) -> str | None:
    """Where ``name`` given as an algorithm or a policy is a method (``algorithm: fedbug``), the
    line that says so and what to write; None otherwise."""
    from fedbug.config.presets import PRESETS  # presets read the schema's registries

    if name not in PRESETS:
        return None
    return f"{kind} {name!r}: {name} is a method, not a single {kind}; write method: {name}"
