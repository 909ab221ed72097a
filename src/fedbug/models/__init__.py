"""Models by name. Each builder takes (input_shape, num_classes, **options) -> nn.Module.

A model of your own is named by its import path, ``model: "package.module:Name"``: ``Name`` is
called with ``model_options`` as keyword arguments, under the run's model seed, exactly as
``fedbug.run(cfg, model=Name)`` calls it. Every process that builds the model (worker processes,
Flower nodes) imports it, so the module must be importable there (installed, or on
``PYTHONPATH``).

A config may come from someone else, so what an import path may name is limited (RELIABILITY.md,
"Trust model"): a ``torch.nn.Module`` subclass always; any other callable (a factory function)
only where the user allows it for the process, with ``--allow-import`` on the command line,
``FEDBUG_ALLOW_IMPORT=1`` in the environment (how worker processes and Flower nodes inherit it),
or :func:`allow_import` in Python. Nothing in a config or a run folder can allow it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedbug.core.process import environment_variable
from fedbug.core.registry import Registry
from fedbug.core.seeding import derive_seed
from fedbug.errors import ConfigError, first_line
from fedbug.models.cnn import DigitsCNN, StandardCNN
from fedbug.models.hf import build_hf, is_hf
from fedbug.models.leaf_cnn import FreezeFLCNN, LeafFemnistCNN
from fedbug.models.logreg import LogisticRegression
from fedbug.models.lstm import ShakespeareLSTM
from fedbug.models.mlp import MLP
from fedbug.models.resnet import resnet18, resnet34
from fedbug.models.size import MAX_PARAMS_ENV, check_size
from fedbug.models.tiny_cnn import FedSeqCNN, TinyImageNetCNN

ModelBuilder = Callable[..., nn.Module]
MODELS: Registry[ModelBuilder] = Registry("model")
MODELS.register("standard_cnn")(StandardCNN)
MODELS.register("digits_cnn")(DigitsCNN)
MODELS.register("mlp")(MLP)
MODELS.register("resnet18")(resnet18)
MODELS.register("resnet34")(resnet34)
MODELS.register("tiny_imagenet_cnn")(TinyImageNetCNN)
MODELS.register("fedseq_cnn")(FedSeqCNN)
MODELS.register("shakespeare_lstm")(ShakespeareLSTM)
MODELS.register("leaf_cnn")(LeafFemnistCNN)
MODELS.register("freezefl_cnn")(FreezeFLCNN)
MODELS.register("logreg")(LogisticRegression)


def is_import_path(name: str) -> bool:
    """Whether a model name is an import path (``package.module:Name``; ``hf:...`` names a
    Hugging Face model, :mod:`fedbug.models.hf`)."""
    return ":" in name and not is_hf(name)


def model_kwargs(cfg: Any) -> dict[str, Any]:
    """A config's keyword options of its model builder: ``model_options``, and for a Hugging
    Face model its ``hf_config``, ``task`` (which picks the head), ``adapters`` and
    ``targets`` (whether a causal LM scores every position)."""
    if not is_hf(cfg.model):
        return dict(cfg.model_options)
    adapters = cfg.adapters.model_dump() if cfg.adapters is not None else None
    hf = {"hf_config": cfg.hf_config, "task": cfg.task, "adapters": adapters}
    return {**cfg.model_options, **hf, "targets": cfg.targets}


#: set to ``1`` to let an import path name a factory function (inherited by child processes)
ALLOW_IMPORT_ENV = "FEDBUG_ALLOW_IMPORT"


def factories_allowed() -> bool:
    """Whether this process may call a function (not a ``nn.Module`` class) named by a config."""
    return os.environ.get(ALLOW_IMPORT_ENV, "") == "1"


@contextlib.contextmanager
def allow_import() -> Iterator[None]:
    """Let configs built and run inside this block name a model factory function by import path
    (and the worker processes and Flower nodes started meanwhile, which inherit the
    environment). Use it only for configs you trust: a config can name any function."""
    with environment_variable(ALLOW_IMPORT_ENV, "1"):
        yield


def _is_module_class(target: object) -> bool:
    return isinstance(target, type) and issubclass(target, nn.Module)


def import_model(path: str) -> Callable[..., nn.Module]:
    """The class or factory an import path ``package.module:Name`` names; ValueError saying
    what is wrong and how to fix it otherwise. A factory (anything callable but a ``nn.Module``
    subclass) is refused unless :func:`factories_allowed`."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"model {path!r}: an import path is 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"model {path!r}: cannot import {module_name!r} ({e}); install it or put its folder "
            "on PYTHONPATH"
        ) from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ValueError(f"model {path!r}: module {module_name!r} has no {attr!r}")
    if _is_module_class(target):
        return target  # type: ignore[no-any-return]
    if not callable(target):
        raise ValueError(f"model {path!r} is not a class or function")
    if not factories_allowed():
        raise ValueError(
            f"model {path!r} names a {type(target).__name__}, not a torch.nn.Module class; "
            "a config may name any function, so fedbug calls one only where you allow it: "
            f"pass --allow-import (or set {ALLOW_IMPORT_ENV}=1) if you trust this config"
        )
    return target  # type: ignore[no-any-return]


def import_root(path: str) -> Path | None:
    """The folder to put on ``PYTHONPATH`` so that another process imports the module of the
    import path ``path`` as this one does (None for an installed module or a built-in)."""
    module = sys.modules.get(path.partition(":")[0])
    file = getattr(module, "__file__", None)
    if module is None or file is None:
        return None
    depth = module.__name__.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    return Path(file).resolve().parents[depth]


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, seed: int, **options: Any
) -> nn.Module:
    """Build a model with weights drawn from a generator seeded by ``(seed, "model")``, after
    counting it on the meta device: one over the size limit is refused before anything is
    allocated (:mod:`fedbug.models.size`, ``FEDBUG_MAX_PARAMS``)."""
    try:
        own = import_model(name) if is_import_path(name) else None
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if own is None and is_hf(name):
        builder = functools.partial(build_hf, name=name)
    else:
        builder = MODELS.get(name) if own is None else None  # type: ignore[assignment]
    if own is not None:
        make = functools.partial(own, **options)
    else:
        make = functools.partial(builder, input_shape, num_classes, **options)
    with torch.random.fork_rng(devices=[]):
        try:
            check_size(name, make, own=own is not None)
            torch.manual_seed(derive_seed(seed, "model"))
            model = make()
            if not isinstance(model, nn.Module):
                raise TypeError(f"it returned a {type(model).__name__}, not a torch module")
            return model
        except (TypeError, ValueError, RuntimeError, ArithmeticError, AssertionError) as e:
            raise ConfigError(f"model {name!r} cannot be built: {first_line(e)}") from None


__all__ = [
    "ALLOW_IMPORT_ENV",
    "MAX_PARAMS_ENV",
    "MODELS",
    "allow_import",
    "factories_allowed",
    "build_model",
    "import_model",
    "import_root",
    "is_import_path",
    "is_hf",
    "model_kwargs",
    "StandardCNN",
    "DigitsCNN",
    "MLP",
    "FedSeqCNN",
    "FreezeFLCNN",
    "LeafFemnistCNN",
    "LogisticRegression",
    "ShakespeareLSTM",
    "TinyImageNetCNN",
    "resnet18",
    "resnet34",
]
