"""Input limits of a config, checked before anything is built from it: the file's bytes, and
the values and characters it holds with YAML aliases expanded (counted, never expanded)."""

from __future__ import annotations

from typing import Any

import yaml

from fedbug.errors import ConfigError


def printable(text: str) -> str:
    """One line: control characters (newlines in a key, say) shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


#: Input limits, checked before anything is built from a config. A few lines of YAML anchors
#: and aliases (``&a [*b, *b, ...]``) expand to billions of values or characters, or refer to
#: themselves; sizes are counted with aliases expanded (each reference counts what it refers
#: to, from sizes computed once per anchor: nothing is expanded) and the check stops at the
#: first limit passed.
#: bytes a config file may have (checked before it is read)
MAX_CONFIG_BYTES = 1 << 20
#: values (keys, list items, blocks) a config may hold
MAX_CONFIG_VALUES = 100_000
#: characters one value (a string or any scalar, or a key) may have
MAX_VALUE_CHARS = 10_000
#: characters of all the keys and values of a config together
MAX_CONFIG_CHARS = 1_000_000


def _too_many_values() -> ConfigError:
    return ConfigError(
        f"a config may hold at most {MAX_CONFIG_VALUES:,} values (keys and list items, YAML "
        "aliases expanded); this one holds more or refers to itself: list fewer values"
    )


def _too_long_value(chars: int, where: str) -> ConfigError:
    return ConfigError(
        f"a config value may be at most {MAX_VALUE_CHARS:,} characters (YAML aliases expanded); "
        f"{where} has {chars:,}: shorten it"
    )


def _too_many_chars() -> ConfigError:
    return ConfigError(
        f"a config may hold at most {MAX_CONFIG_CHARS:,} characters of keys and values (YAML "
        "aliases expanded); this one holds more: repeat long values less (fewer aliases)"
    )


def _check_size(doc: Any) -> None:
    """Refuse a document (as built from YAML and overrides) past the value or character limits,
    counting a shared object once per reference and stopping at the first limit passed."""
    count = chars = 0
    stack = [doc]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise _too_many_values()
        if isinstance(node, str | bytes):
            if len(node) > MAX_VALUE_CHARS:
                raise _too_long_value(len(node), f"a value starting {printable(str(node[:20]))!r}")
            chars += len(node)
            if chars > MAX_CONFIG_CHARS:
                raise _too_many_chars()
        elif isinstance(node, dict):
            stack += [*node.keys(), *node.values()]
        elif isinstance(node, (list, tuple, set)):
            stack += node


def check_yaml_size(text: str) -> None:
    """Refuse YAML text whose document, aliases expanded, passes the limits, before anything is
    built from it: its parse events are counted as they come, an anchor's size once (an alias
    adds it), so a few lines that expand to billions stop as soon as a limit is passed. Text
    that is not valid YAML is left to the loader to report."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where present
    anchors: dict[str, tuple[int, int] | None] = {}  # None: the anchored node is still open
    frames: list[list[Any]] = []  # open blocks and lists: [values, chars, anchor]
    count = chars = 0

    def add(values: int, length: int) -> None:
        nonlocal count, chars
        count += values
        chars += length
        if frames:
            frames[-1][0] += values
            frames[-1][1] += length
        if count > MAX_CONFIG_VALUES:
            raise _too_many_values()
        if chars > MAX_CONFIG_CHARS:
            raise _too_many_chars()

    try:
        for ev in yaml.parse(text, Loader=loader):
            if isinstance(ev, yaml.ScalarEvent):
                if len(ev.value) > MAX_VALUE_CHARS:
                    line = f"the value at line {ev.start_mark.line + 1}" if ev.start_mark else ""
                    raise _too_long_value(len(ev.value), line or "a value")
                add(1, len(ev.value))
                if ev.anchor is not None:
                    anchors[ev.anchor] = (1, len(ev.value))
            elif isinstance(ev, yaml.SequenceStartEvent | yaml.MappingStartEvent):
                add(1, 0)
                frames.append([1, 0, ev.anchor])
                if ev.anchor is not None:
                    anchors[ev.anchor] = None
            elif isinstance(ev, yaml.SequenceEndEvent | yaml.MappingEndEvent):
                values, length, anchor = frames.pop()
                if anchor is not None:
                    anchors[anchor] = (values, length)
                if frames:
                    frames[-1][0] += values
                    frames[-1][1] += length
            elif isinstance(ev, yaml.AliasEvent) and ev.anchor in anchors:
                size = anchors[ev.anchor]
                if size is None:  # an alias inside its own anchor: the node contains itself
                    raise _too_many_values()
                add(*size)
    except yaml.YAMLError:
        return
