"""Experiment configs: YAML files validated by pydantic, with ``key=value`` overrides.

Every hyperparameter block of an algorithm (``fedprox: {mu: ...}``) comes from the algorithm's
own ``params_cls``, so a new algorithm brings its config with it. An unknown key or a bad value
is one :class:`~fedbug.errors.ConfigError` that names the key and the fix.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from fedbug.algorithms import ALGORITHMS
from fedbug.config.compat import blocks_used_elsewhere, check_compatible, owners
from fedbug.config.limits import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_CHARS,
    MAX_CONFIG_VALUES,
    MAX_VALUE_CHARS,
    _check_size,
    check_yaml_size,
    printable,
)
from fedbug.core.tasks import TASKS
from fedbug.data import DATASETS
from fedbug.data.augment import AUGMENTATIONS
from fedbug.errors import ConfigError, FedbugError
from fedbug.integrations.flower.params import FlowerParams
from fedbug.integrations.tracking import check_available, check_tracking_uri
from fedbug.models import MODELS, import_model, is_import_path
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
    units: list[str | list[str]] | None = None
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
    executor: Literal["sequential", "processes", "flower-simulation", "flower-deployment"] = Field(
        "sequential",
        description="where clients train: this process (sequential), worker processes, or "
        "Flower (pip install 'fedbug[flower]'); every executor gives the same numbers",
    )
    flower: FlowerParams = Field(
        default_factory=FlowerParams, description="the Flower executors' settings"
    )
    tracking: list[Literal["tensorboard", "mlflow"]] = Field(
        default_factory=list,
        description="also write each round to TensorBoard and/or MLflow (pip install "
        "'fedbug[track]')",
    )
    tracking_uri: str | None = Field(
        None, description="MLflow's tracking URI (default: a local store, mlruns/ beside the run)"
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

    @model_validator(mode="after")
    def _check(self) -> BaseConfig:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(_unknown("algorithm", self.algorithm, ALGORITHMS.names()))
        if self.augment != "auto" and self.augment not in AUGMENTATIONS:
            raise ValueError(_unknown("augment", self.augment, ["auto", *AUGMENTATIONS.names()]))
        if is_import_path(self.model):
            import_model(self.model)  # a ValueError saying what is wrong
        elif self.model not in MODELS:
            raise ValueError(_unknown("model", self.model, MODELS.names()))
        if self.dataset not in DATASETS:
            raise ValueError(_unknown("dataset", self.dataset, DATASETS.names()))
        if self.policy not in POLICIES:
            raise ValueError(_unknown("policy", self.policy, POLICIES.names()))
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
        if self.tracking:
            check_available(self.tracking)
        if self.tracking_uri is not None:
            try:
                check_tracking_uri(self.tracking_uri)
            except FedbugError as e:
                raise ValueError(str(e)) from None
        return self

    def options(self, name: str) -> Any:
        """The options block named ``name`` (a method's ``params_cls``), None if it has none."""
        return self.__dict__.get(name)

    def resolved_selection(self) -> str:
        if self.selection:
            return self.selection
        return "uniform" if self.clients_per_round is not None else "bernoulli"


# PyYAML's tag constructors raise plain Python errors (``!!int x``), deep nesting RecursionError.
YAML_ERRORS = (yaml.YAMLError, ValueError, TypeError, AttributeError, RecursionError)


def _unknown(kind: str, name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {kind} {name!r}{hint}; known: {', '.join(known)}"


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


#: names other tools use for a key, so that a misspelling of them still finds fedbug's key
KEY_ALIASES = {
    "learning_rate": "lr",
    "learningrate": "lr",
    "epochs": "local_epochs",
    "steps": "local_steps",
    "clients": "num_clients",
    "n_clients": "num_clients",
    "num_rounds": "rounds",
    "global_rounds": "rounds",
    "client_fraction": "participation",
    "participation_rate": "participation",
    "batchsize": "batch_size",
    "algo": "algorithm",
    "data": "dataset",
}


def closest_key(key: str) -> str | None:
    """The valid key an unknown dotted ``key`` most likely meant: a key of the same block close
    to its last part (or a known alias of one), else a key of another block with that name."""
    keys = all_keys()
    prefix, _, last = key.rpartition(".")
    prefix = f"{prefix}." if prefix else ""
    siblings = [k[len(prefix) :] for k in keys if k.startswith(prefix)]
    siblings = [k for k in siblings if "." not in k]
    names = siblings + ([a for a in KEY_ALIASES if a not in siblings] if not prefix else [])
    close = difflib.get_close_matches(last, names, n=1, cutoff=0.5)
    if close:
        return prefix + (close[0] if close[0] in siblings else KEY_ALIASES[close[0]])
    elsewhere = [k for k in keys if k.rpartition(".")[2] == last]
    if elsewhere:
        return elsewhere[0]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    return close[0] if close else None


def _format_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = printable(".".join(str(p) for p in e["loc"]))
        if e["type"] == "extra_forbidden":
            close = closest_key(loc)
            hint = f"; did you mean {close!r}?" if close else "; see the README's config keys"
            parts.append(f"unknown key {loc!r}{hint}")
        else:
            msg = printable(e["msg"].removeprefix("Value error, "))
            given = e.get("input")
            shown = repr(given) if not isinstance(given, dict) else "a mapping"
            if len(shown) > 60:
                shown = shown[:57] + "..."
            if e["type"] in _NUMBER_ERRORS and _is_nan(given):
                msg = "not a number; give a number"  # nan fails every bound, so say why
            parts.append(f"{loc}: {msg} (got {shown})" if loc else msg)
    return "invalid config: " + "; ".join(parts)


#: pydantic error types of a number field (a bound, a finite number, a number's parsing)
_NUMBER_ERRORS = {
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "finite_number",
    "float_parsing",
    "float_type",
    "int_from_float",
    "int_parsing",
    "int_type",
    "multiple_of",
}


def _is_nan(value: Any) -> bool:
    """Whether ``value`` is NaN, or text that reads as NaN (``-s lr=nan`` gives 'nan')."""
    if isinstance(value, str) and len(value) < 16:
        try:
            value = float(value.strip().removeprefix("."))
        except ValueError:
            return False
    return isinstance(value, float) and math.isnan(value)


def parse_value(text: str) -> Any:
    """An override's value as YAML would read it (numbers, booleans, null, lists)."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except YAML_ERRORS:
        return text  # not YAML: the raw text, which the key's type then accepts or refuses


def set_dotted(doc: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"bad override key {key!r}; use key=value or block.key=value")
    node = doc
    for p in parts[:-1]:
        child = node.get(p)
        if child is None:
            child = node[p] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {p!r} is not a block of keys")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not key=value (e.g. -s lr=0.05)")
    return key.strip(), parse_value(value)


# ``method:`` presets: a name -> the keys it sets. Keys the config sets itself win. A method that
# is an algorithm's name just selects that algorithm.
_FREEZING = {"policy": "freezefl", "aggregation": "layerwise", "upload": "partial"}
PRESETS: dict[str, dict[str, Any]] = {
    # FreezeFL Table III (the system: block comes from the config)
    "freezing": _FREEZING,
    "freezing_cs": {**_FREEZING, "selection": "reputation", "reputation": {"warm_restart": 0}},
    "freezefl": {**_FREEZING, "selection": "reputation"},
    "rbcsf": {"algorithm": "fedavg", "selection": "rbcsf"},
    # FreezeFL Table IV: Fjord (K uniform, as FedAvg) and Fjord with reputation selection
    "fjord": {"algorithm": "fjord", "selection": "uniform"},
    "fjord_cs": {
        "algorithm": "fjord",
        "selection": "reputation",
        "reputation": {"warm_restart": 0},
    },
    "fedseq-vanilla": {"algorithm": "fedbabu", "schedule": "vanilla", "evaluation": "personalized"},
    "fedseq-anti": {"algorithm": "fedbabu", "schedule": "anti", "evaluation": "personalized"},
}


def apply_method(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with its ``method`` preset's keys filled in where the document is silent."""
    method = doc.get("method")
    if method is None:
        return doc
    if not isinstance(method, str):
        raise ConfigError(f"method must be a name; got {method!r}")
    if method in PRESETS:
        preset = PRESETS[method]
    elif method in ALGORITHMS:
        preset = {"algorithm": method}
    else:
        raise ConfigError(_unknown("method", method, sorted([*PRESETS, *ALGORITHMS.names()])))
    return _merge(preset, doc)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def grid_blocks(grid: Any) -> frozenset[str]:
    """The options blocks a grid's cells may use: those of the methods it names, as values
    (``algorithm: [fedavg, fedprox]``, a ``method:`` preset's), as keys (``fedprox.mu``) or in
    a cell's mapping (``{policy: bottom_up, bottom_up.gu_ratio: 0.5}``)."""
    words: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                words.add(str(k).split(".")[0])
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)
        elif isinstance(x, str) and x not in words:
            words.add(x)
            if x in PRESETS:
                walk(PRESETS[x])

    walk(grid)
    return frozenset(b for b in owners() if b in words)


def validate(doc: Any) -> BaseConfig:
    if not isinstance(doc, dict):
        raise ConfigError(f"a config must be a mapping of keys to values, not {type(doc).__name__}")
    _check_size(doc)
    doc = apply_method(doc)
    # a sweep's base may hold the options of the methods its cells compare (and only those)
    grid = doc.get("grid")
    relaxed = blocks_used_elsewhere(grid_blocks(grid)) if grid else nullcontext()
    try:
        with relaxed:
            return config_class().model_validate(doc)
    except ValidationError as e:
        raise ConfigError(_format_error(e)) from None


def read_config_doc(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found; give the path of a YAML file")
    with open(p, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config file {str(p)!r} is over {MAX_CONFIG_BYTES:,} bytes (1 MiB), the most a "
            "config may have; keep data in files the config names (data_dir), not in the config"
        )
    try:
        text = raw.decode("utf-8")
        try:
            check_yaml_size(text)
        except ConfigError as e:
            raise ConfigError(f"config file {str(p)!r}: {e}") from None
        doc = yaml.safe_load(text)
    except (*YAML_ERRORS, UnicodeDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {first}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of keys to values")
    doc.setdefault("name", _safe_name(p.stem))
    return doc


def _safe_name(stem: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "._+-" else "-" for c in stem)
    return cleaned or "experiment"


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, doc: dict | None = None
) -> BaseConfig:
    """Read a YAML config (or start from ``doc``), apply ``key=value`` overrides, validate."""
    data = read_config_doc(path) if path is not None else dict(doc or {})
    for text in overrides or []:
        key, value = parse_override(text)
        set_dotted(data, key, value)
    return validate(data)


def resolve(cfg: BaseConfig) -> BaseConfig:
    """Fill what defaults to the machine (threads) so the saved config reproduces the run."""
    if cfg.threads is None:
        cores = os.cpu_count() or 1
        if cfg.executor == "processes":  # the cores shared among the workers
            cores = max(1, cores // cfg.workers)
        return cfg.model_copy(update={"threads": cores})
    return cfg


_LATER_KEYS = (
    "on_divergence",
    "min_results",
    "memory_format",
    "dataset_options",
    "task",
    "precision",
)
_NOT_HASHED = {
    "on_short_round",  # a run either stops or skips rounds it records; resumable either way
    "grid",
    "seeds",
    "name",
    "count_flops",
    "threads",
    "executor",
    "workers",
    "flower",
    "tracking",
    "tracking_uri",
    "device",
    "device_data_share",
    "deterministic",
}


def config_hash(cfg: BaseConfig) -> str:
    """A short hash of everything that changes the numbers (not sweep bookkeeping)."""
    # threads is left out so a run resumes on a machine with another core count (its numbers
    # then agree within float32 rounding, not bitwise); it is recorded in config.yaml. Where
    # clients run (executor and its settings) does not change the numbers.
    d = cfg.model_dump(mode="json", exclude=_NOT_HASHED)
    # keys added after run folders existed count only when set, so older folders still resume
    for key in _LATER_KEYS:
        if d.get(key) == BaseConfig.model_fields[key].get_default(call_default_factory=True):
            d.pop(key, None)
    _later_options_when_set(d, cfg)
    _policy_options_as_before(d, cfg.policy)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


#: Policy options that were top-level keys before policies owned their blocks, with the value
#: they had when unset; hashed where they were, so run folders from then still resume.
_FORMER_POLICY_KEYS = {"gu_ratio": 0.0, "fixed_units": 1}
#: The options blocks every hash held, chosen or not; a block added since counts only when its
#: method is chosen (and a former top-level key goes back to the top level).
_ALWAYS_HASHED_BLOCKS = {
    "fedprox",
    "feddyn",
    "fedexp",
    "feddecorr",
    "fedrep",
    "fjord",
    "freezefl",
    "reputation",
    "rbcsf",
}


#: Options added to a method's block after run folders existed: hashed only when they differ
#: from their default, so folders from before still resume.
_LATER_OPTIONS = {"feddyn": ("clip",), "bottom_up": ("gu_period",), "top_down": ("gu_period",)}


def _later_options_when_set(d: dict[str, Any], cfg: BaseConfig) -> None:
    for name, keys in _LATER_OPTIONS.items():
        block, params = d.get(name), cfg.options(name)
        if not isinstance(block, dict) or params is None:
            continue
        fields = type(params).model_fields
        for key in keys:
            if key in block and block[key] == fields[key].get_default(call_default_factory=True):
                del block[key]


def _policy_options_as_before(d: dict[str, Any], policy: str) -> None:
    """Options blocks in ``d`` hashed as they were before policies owned their blocks: the
    chosen policy's former top-level keys at the top level (their former defaults otherwise),
    blocks added since only when their method is chosen."""
    former = dict(_FORMER_POLICY_KEYS)
    chosen = {d.get("algorithm"), policy, d.get("selection")}
    for registry in (ALGORITHMS, POLICIES, SELECTIONS):
        for name, cls in registry.items():
            if cls.params_cls is None or name in _ALWAYS_HASHED_BLOCKS:
                continue
            block = d.pop(name, None)
            if name not in chosen or block is None:
                continue
            for key, value in block.items():
                if key in former and registry is POLICIES:
                    former[key] = value
                else:
                    d.setdefault(name, {})[key] = value
    d.update(former)


__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_CHARS",
    "MAX_CONFIG_VALUES",
    "MAX_VALUE_CHARS",
    "BaseConfig",
    "Config",
    "check_yaml_size",
    "config_class",
    "config_hash",
    "load_config",
    "resolve",
    "validate",
]
