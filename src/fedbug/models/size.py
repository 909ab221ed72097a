"""How large a model a config may ask for (RELIABILITY.md, "Input limits").

A config from someone else names a model and its options (``model_options``, ``hf_config``,
the data set's shapes), and so how much memory building it takes. Before the real model is
built, :func:`fedbug.models.build_model` builds it once on the meta device (shapes, no memory,
no weights read, nothing drawn from the run's generator) and counts the values it holds: its
parameters and buffers (under adapters a base model's weights are buffers). A model over the
limit is one :class:`~fedbug.errors.ConfigError` line giving the count and the way to raise the
limit. The limit is the trusted person's, never the config's: ``FEDBUG_MAX_PARAMS`` in the
environment of the command (inherited by worker processes and Flower nodes), default
2,000,000,000 (8 GB of float32 for the weights alone; a run holds several copies).

A model class or factory of the user's own (``model: package.module:Name``, trusted code) that
cannot be built on the meta device is not counted.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from itertools import chain

import torch
from torch import nn

from fedbug.errors import ConfigError

#: the environment variable that sets the limit (a whole number of parameters)
MAX_PARAMS_ENV = "FEDBUG_MAX_PARAMS"
#: the limit where the environment does not set one
DEFAULT_MAX_PARAMS = 2_000_000_000
#: most blocks (layers) a model built from a config may have, a fixed limit: the largest
#: published models have about 130, and 10^5 GPT-2 blocks took minutes to build (10^8 ran
#: out of memory); a model's counts are checked against it before it is built, even on meta
MAX_LAYERS = 1_000


def max_params() -> int:
    """The most values a model built from a config may hold: ``$FEDBUG_MAX_PARAMS``, else
    :data:`DEFAULT_MAX_PARAMS`; one line where the variable is not a positive whole number."""
    given = os.environ.get(MAX_PARAMS_ENV, "").strip()
    if not given:
        return DEFAULT_MAX_PARAMS
    try:
        limit = int(given)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ConfigError(
            f"{MAX_PARAMS_ENV}={given!r}: a whole number of parameters of at least 1 (e.g. "
            f"{MAX_PARAMS_ENV}=5000000000); fix it or unset it for the default "
            f"{DEFAULT_MAX_PARAMS:,}"
        )
    return limit


def tensor_count(model: nn.Module) -> int:
    """The values ``model`` holds: its parameters and buffers, a tensor shared by two modules
    (tied weights) once."""
    tensors = {id(t): t.numel() for t in chain(model.parameters(), model.buffers())}
    return sum(tensors.values())


def count_params(build: Callable[[], nn.Module]) -> int:
    """:func:`tensor_count` of the model ``build()`` makes, built on the meta device: no memory
    for its weights, and the caller's random generator left as it was. Raises what ``build``
    raises."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        return tensor_count(build())


def check_size(name: str, build: Callable[[], nn.Module], own: bool = False) -> None:
    """Refuse, in one line, the model ``name`` that ``build()`` would make where it holds more
    than :func:`max_params` values, counted on the meta device before anything is allocated.
    ``own``: the user's own class or factory, not counted where it cannot be built on meta."""
    limit = max_params()
    try:
        count = count_params(build)
    except Exception:
        if own:  # trusted code that needs real tensors to build: left unchecked
            return
        raise
    if count > limit:
        raise ConfigError(
            f"model {name!r} has {count:,} parameters, over the limit of {limit:,} "
            f"({4 * limit / 1e9:,.1f} GB as float32) for a model built from a config; a config "
            f"cannot raise it: if you mean to build it, start fedbug with "
            f"{MAX_PARAMS_ENV}={count} (or more) in the environment"
        )
