"""Experiment configs: YAML files validated by pydantic, with ``key=value`` overrides.

Every hyperparameter block of an algorithm (``fedprox: {mu: ...}``) comes from the algorithm's
own ``params_cls``, so a new algorithm brings its config with it. An unknown key or a bad value
is one :class:`~fedbug.errors.ConfigError` that names the key and the fix.

The package: ``schema`` (the fields, :func:`config_class`), ``presets`` (``method:``),
``loading`` (files, overrides, validation, error lines), ``hashing`` (:func:`config_hash`),
``limits`` (input sizes), ``compat`` (pieces that cannot run together). Import from here.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from fedbug.config.hashing import config_hash
from fedbug.config.limits import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_CHARS,
    MAX_CONFIG_VALUES,
    MAX_VALUE_CHARS,
    check_yaml_size,
)
from fedbug.config.loading import (
    KEY_ALIASES,
    YAML_ERRORS,
    closest_key,
    load_config,
    parse_override,
    parse_value,
    read_config_doc,
    resolve,
    set_dotted,
    validate,
    with_overrides,
)
from fedbug.config.presets import PRESETS, apply_method, grid_blocks
from fedbug.config.schema import BaseConfig, Config, all_keys, config_class

__all__ = [
    "KEY_ALIASES",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_CHARS",
    "MAX_CONFIG_VALUES",
    "MAX_VALUE_CHARS",
    "PRESETS",
    "YAML_ERRORS",
    "BaseConfig",
    "Config",
    "all_keys",
    "apply_method",
    "check_yaml_size",
    "closest_key",
    "config_class",
    "config_hash",
    "grid_blocks",
    "load_config",
    "parse_override",
    "parse_value",
    "read_config_doc",
    "resolve",
    "set_dotted",
    "with_overrides",
    "validate",
]


class _CallableModule(types.ModuleType):
    """``fedbug.config(**values)``: this package, called, is a validated config from keyword
    values (the same keys as the YAML files). ``fedbug.config`` names this package once it is
    imported, so the call lives here rather than as a function beside it."""

    def __call__(self, **values: Any) -> BaseConfig:
        return load_config(None, doc=values)


sys.modules[__name__].__class__ = _CallableModule
