"""Models by name. Each builder takes (input_shape, num_classes, **options) -> nn.Module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedbug.errors import ConfigError
from fedbug.models.cnn import DigitsCNN, StandardCNN
from fedbug.models.leaf_cnn import FreezeFLCNN, LeafFemnistCNN
from fedbug.models.logreg import LogisticRegression
from fedbug.models.lstm import ShakespeareLSTM
from fedbug.models.mlp import MLP
from fedbug.models.resnet import resnet18, resnet34
from fedbug.models.tiny_cnn import FedSeqCNN, TinyImageNetCNN
from fedbug.registry import Registry
from fedbug.seeding import derive_seed

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


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, seed: int, **options: Any
) -> nn.Module:
    """Build a model with weights drawn from a generator seeded by ``(seed, "model")``."""
    builder = MODELS.get(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "model"))
        try:
            return builder(input_shape, num_classes, **options)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ConfigError(f"model {name!r} cannot be built: {e}") from None


__all__ = [
    "MODELS",
    "build_model",
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
