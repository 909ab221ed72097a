"""Reading a config: a YAML file's document (within the input limits), ``key=value`` overrides
set into it, its ``method:`` preset filled in, and validation into the config class, a pydantic
error read back as one line naming the key and the fix; and :func:`resolve`, which fills what
defaults to the machine."""

from __future__ import annotations

import difflib
import math
import os
import re
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fedbug.config.compat import blocks_used_elsewhere
from fedbug.config.limits import MAX_CONFIG_BYTES, _check_size, check_yaml_size, printable
from fedbug.config.presets import apply_method, grid_blocks, method_over_file
from fedbug.config.schema import BaseConfig, all_keys, config_class
from fedbug.core.registry import own_hint
from fedbug.errors import ConfigError, first_line

# PyYAML's tag constructors raise plain Python errors (``!!int x``), deep nesting RecursionError.
YAML_ERRORS = (yaml.YAMLError, ValueError, TypeError, AttributeError, RecursionError)


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


def _one_swap(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with two neighbouring letters swapped ('rl' for 'lr')."""
    if len(a) != len(b) or a == b:
        return False
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return (
        len(diff) == 2
        and diff[1] == diff[0] + 1
        and a[diff[0]] == b[diff[1]]
        and a[diff[1]] == b[diff[0]]
    )


def closest_key(key: str) -> str | None:
    """The valid key an unknown dotted ``key`` most likely meant: a known alias, or a key of the
    same block with two neighbouring letters swapped; for a top-level key, else a key of a
    block with that name; else a key of the same block close to its last part (or an alias
    close to it); else a key of another block with that name; a key of no known block may also
    be close to a valid key as a whole."""
    keys = all_keys()
    prefix, _, last = key.rpartition(".")
    siblings = _block_keys(prefix)
    names = siblings + ([a for a in KEY_ALIASES if a not in siblings] if not prefix else [])
    # only a real likeness ('bogus' is half of 'configs', and of 'rounds', by difflib's
    # count), or the same letters swapped ('rl' for 'lr')
    swapped = [n for n in names if _one_swap(n, last)]
    exact = [last] if last in names else []
    # a top-level key that is a key of a block: that key before a likeness ('gu_ratio' is
    # bottom_up.gu_ratio, not 'aggregation'); in a block, its own keys' likeness comes first
    elsewhere = [k for k in keys if k.rpartition(".")[2] == last]
    if elsewhere and not prefix and not (exact or swapped):
        return elsewhere[0]
    close = exact or swapped[:1] or difflib.get_close_matches(last, names, n=1, cutoff=0.6)
    dot = f"{prefix}." if prefix else ""
    if close:
        return dot + (close[0] if close[0] in siblings else KEY_ALIASES[close[0]])
    if elsewhere:
        return elsewhere[0]
    if siblings and prefix:
        return None  # a block's key is not its block's name, nor a key of a block named alike
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    return close[0] if close else None


def _block_keys(block: str) -> list[str]:
    """The keys of the options block ``block`` (dotted; "" for the top level) in the order its
    class declares them; [] if there is no such block."""
    dot = f"{block}." if block else ""
    inner = [k[len(dot) :] for k in all_keys() if k.startswith(dot)]
    return [k for k in inner if "." not in k]


def _unknown_key(loc: str, given: Any = None) -> str:
    """One unknown key's part of the message: the key it meant where one is close, and a
    block's keys where the key is in a block and is not a typo of one of them. A top-level
    block like no other is perhaps the options of a method of the user's, not registered."""
    close = closest_key(loc)
    block = loc.rpartition(".")[0]
    keys = _block_keys(block) if block else []
    hints = [f"did you mean {close!r}?"] if close else []
    if keys and not (close or "").startswith(f"{block}."):
        hints.append(f"{block} takes: {', '.join(keys)}")
    hint = " ".join(hints) or "see the README's config keys"
    if not hints and not block and isinstance(given, dict):
        hint += f"; the options block of {own_hint('method')}"
    return f"unknown key {loc!r}; {hint}"


def _given(msg: str, loc: str, given: Any, own: bool) -> str:
    """A refused value's part of the message: the key, the reason and the value, each once.
    A message that starts with its key keeps it; a validator's ``own`` message that says what
    it got keeps that (pydantic's own messages, 'got a number with a fractional part', do not
    show the value)."""
    shown = repr(given) if not isinstance(given, dict) else "a mapping"
    if len(shown) > 60:
        shown = shown[:57] + "..."
    if not (own and re.search(r"\bgot\b", msg)):
        msg = f"{msg} (got {shown})"
    if re.match(rf"{re.escape(loc)}(?![\w.])", msg):
        return msg
    return f"{loc}: {msg}"


def _format_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = printable(".".join(str(p) for p in e["loc"]))
        if e["type"] == "extra_forbidden":
            parts.append(_unknown_key(loc, e.get("input")))
            continue
        msg = printable(e["msg"].removeprefix("Value error, "))
        given = e.get("input")
        if e["type"] in _NUMBER_ERRORS and _is_nan(given):
            msg = "not a number; give a number"  # nan fails every bound, so say why
        own = e["type"] in ("value_error", "assertion_error")  # a validator's own message
        parts.append(_given(msg, loc, given, own) if loc else msg)
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
        first = first_line(e)
        if isinstance(e, yaml.MarkedYAMLError) and e.problem:  # where: line and column
            mark, opened = e.problem_mark, e.context_mark
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            if e.context and opened is not None and (mark is None or opened.line != mark.line):
                where += f", {e.context} begun at line {opened.line + 1}"
            first = f"{e.problem}{where}"
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
    """Read a YAML config (or start from ``doc``), apply ``key=value`` overrides, validate. A
    ``method=`` override replaces the file's own algorithm, policy, schedule and selection
    (:func:`~fedbug.config.presets.method_over_file`)."""
    data = read_config_doc(path) if path is not None else dict(doc or {})
    return validate(with_overrides(data, overrides or []))


def with_overrides(doc: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``doc`` with the ``key=value`` overrides set (``-s``; ``key=null`` gives a key back its
    default, removing the file's value); a ``method=`` among them replaces
    the document's own algorithm, policy, schedule and selection but for those the overrides
    set too (:func:`~fedbug.config.presets.method_over_file`)."""
    pairs = [parse_override(text) for text in overrides]
    given = dict(pairs)
    if "method" in given:  # the command line's method replaces the file's choice of one
        # a value that is not a name (policy=[1]) is left to validation, which names the key
        names = {k: v for k, v in given.items() if not isinstance(v, list | dict)}
        doc = method_over_file(doc, names)
    for key, value in pairs:
        if value is None:  # key=null: the key back to its default (no key's default is a value
            unset_dotted(doc, key)  # that null would not also mean), the file's value gone
        else:
            set_dotted(doc, key, value)
    return doc


def unset_dotted(doc: dict[str, Any], key: str) -> None:
    """Remove ``key`` (dotted) from ``doc`` where it is there."""
    *blocks, last = key.split(".")
    node: Any = doc
    for p in blocks:
        node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)


def resolve(cfg: BaseConfig) -> BaseConfig:
    """Fill what defaults to the machine (threads) so the saved config reproduces the run."""
    if cfg.threads is None:
        cores = os.cpu_count() or 1
        if cfg.executor == "processes":  # the cores shared among the workers
            cores = max(1, cores // cfg.workers)
        return cfg.model_copy(update={"threads": cores})
    return cfg
