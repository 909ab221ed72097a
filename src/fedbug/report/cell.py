"""A grid's cell and a report's group of runs: :class:`Cell`, its overrides and the one name
both a sweep's table (:mod:`fedbug.sweeps.sweep`) and a report's rows
(:mod:`fedbug.report.naming`) give it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedbug.config import config_class


@dataclass
class Cell:
    """One point of the grid: its overrides and a short label. A report's group of runs is a
    cell too: ``given`` is the sweep cell its runs came from, whose label it takes (read back
    from the sweep's sweep.json, :func:`~fedbug.report.groups.sweep_order`), ``method`` what
    its runs ran (:func:`~fedbug.report.groups.method_name`), its name where no key varies."""

    values: dict[str, Any]
    given: Cell | None = None
    method: str = ""

    def pairs(self) -> list[tuple[str, Any]]:
        """(key, value) pairs, a variant group's keys in place of the group (its ``label``, a
        name for the reader, left out), as given: a key may come twice."""
        out: list[tuple[str, Any]] = []
        for k, v in self.values.items():
            if is_variant_group(k, v):
                out += [(kk, vv) for kk, vv in v.items() if kk != LABEL]
            else:
                out.append((k, v))
        return out

    def items(self) -> list[tuple[str, Any]]:
        """:meth:`pairs` as they apply (:func:`~fedbug.sweeps.sweep.merge_dotted`, in order):
        a key given again drops its earlier value (``-g bottom_up.gu_ratio=0`` over a variant
        group's 0.5), unless the later value is a mapping, merged into the earlier key by key."""
        out: list[tuple[str, Any]] = []
        for k, v in self.pairs():
            if not (isinstance(v, dict) and v):
                out = [(kk, vv) for kk, vv in out if kk != k]
            out.append((k, v))
        return out

    @property
    def named_groups(self) -> list[str]:
        """The grid keys of the variant group entries whose ``label`` names the cell: each that
        has one, unless a later key of the cell (``-g bottom_up.gu_ratio=0.3``) replaces one of
        the entry's own keys, where its label (``FedBug 50%``) would name a value that does not
        run; that cell is named by its settings."""
        out = []
        keys = list(self.values)
        for i, (k, v) in enumerate(self.values.items()):
            if not (is_variant_group(k, v) and LABEL in v):
                continue
            own = [leaf for kk, vv in v.items() if kk != LABEL for leaf in _leaves(kk, vv)]
            later = [leaf for kk in keys[i + 1 :] for leaf in _set_by(kk, self.values[kk])]
            if not any(_overlap(a, b) for a in own for b in later):
                out.append(k)
        return out

    @property
    def names(self) -> list[str]:
        """The ``label`` of each variant group entry that names the cell (``FedBug 50%``,
        :attr:`named_groups`)."""
        return [str(self.values[k][LABEL]) for k in self.named_groups]

    @property
    def entry_label(self) -> str:
        """:attr:`label` with every variant group entry's name, also one whose key a later key
        replaced: for messages that point at the grid as the user wrote it."""
        every = [
            str(v[LABEL]) for k, v in self.values.items() if is_variant_group(k, v) and LABEL in v
        ]
        keys = ", ".join(f"{k}={v}" for k, v in self.items())
        names = ", ".join(every)
        if names:
            return f"{names} ({keys})" if keys else names
        return self.label

    def without(self, blocks: set[str]) -> Cell:
        """This cell less its keys under the options blocks ``blocks`` (``bottom_up.gu_ratio``
        of a cell whose method does not read ``bottom_up``), also those a variant group sets."""

        def keep(key: str) -> bool:
            return key.split(".")[0] not in blocks

        values: dict[str, Any] = {}
        for k, v in self.values.items():
            if is_variant_group(k, v):  # an entry that loses a key loses its label with it
                cut = any(kk != LABEL and not keep(kk) for kk in v)
                values[k] = {
                    kk: vv
                    for kk, vv in v.items()
                    if (kk != LABEL and keep(kk)) or (kk == LABEL and not cut)
                }
            elif keep(k):
                values[k] = v
        return Cell(values, self.given, self.method)

    @property
    def label(self) -> str:
        """The one name of a cell, in a sweep's table and a report's: ``FedBug 50% (policy=
        bottom_up, bottom_up.gu_ratio=0.5)`` (a variant group's ``label``, then its keys), else
        ``key=value, ...``; with no key, the runs' method, else ``base``."""
        if self.given is not None:
            return self.given.label
        keys = ", ".join(f"{k}={v}" for k, v in self.items())
        names = ", ".join(self.names)
        if names:
            return f"{names} ({keys})" if keys else names
        return keys or self.method or "base"

    @property
    def slug(self) -> str:
        return _slug(self.items())

    @property
    def old_slug(self) -> str:
        """The slug fedbug gave before a key given twice named only the value that runs (both
        values): an existing sweep folder's run may have this name
        (:func:`~fedbug.sweeps.sweep.run_folder`)."""
        return _slug(self.pairs())


def _leaves(key: str, value: Any) -> list[str]:
    """The dotted keys a pair sets: a mapping's keys one by one (``bottom_up: {gu_ratio: 0.5}``
    sets ``bottom_up.gu_ratio``), an empty one or a scalar its key."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(f"{key}.{k}", v)]
    return [key]


def _set_by(key: str, value: Any) -> list[str]:
    """The dotted keys a later grid key sets over the cell's earlier ones: a variant group's
    own keys (its label is no key), else the pair's :func:`_leaves`."""
    if is_variant_group(key, value):
        return [leaf for k, v in value.items() if k != LABEL for leaf in _leaves(k, v)]
    return _leaves(key, value)


def _overlap(a: str, b: str) -> bool:
    """Whether setting dotted key ``b`` changes what dotted key ``a`` holds (or the reverse)."""
    return a == b or a.startswith(f"{b}.") or b.startswith(f"{a}.")


def _slug(items: list[tuple[str, Any]]) -> str:
    text = "_".join(f"{k.split('.')[-1]}-{v}" for k, v in items) or "base"
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:100]


#: A variant group entry's name for the reader (not a config key): ``{label: FedAvg, ...}``.
LABEL = "label"


def is_variant_group(key: str, value: Any) -> bool:
    """A grid key that is not a config key and whose value is a mapping sets several keys at
    once: ``grid: {data: [{dataset: digits}, {dataset: fashion_mnist, subsample: 0.1}]}``."""
    return isinstance(value, dict) and key.split(".")[0] not in config_class().model_fields
