"""Body/head layout of a model's units, for personalized FL (FedSeq Sec. 3, FedBABU, FedPer).

The last ``head_units`` units of the model are the head, the units before them the base, cut
into K *sub-layers* (FedSeq's "base layers"): one per base unit by default, K consecutive groups
(earlier groups take the extra unit) for an integer K, or listed groups of unit names. Units an
algorithm adds to the model (FedROD's personal head) are ``extra``: neither base nor head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedbug.core.units import Unit
from fedbug.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    num_units: int
    base: tuple[int, ...]
    head: tuple[int, ...]
    sublayers: tuple[tuple[int, ...], ...]
    extra: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.extra != tuple(range(self.num_units - len(self.extra), self.num_units)):
            raise ValueError(
                f"units an algorithm adds to the model must come last; extra units {self.extra} "
                f"of {self.num_units}"
            )

    @property
    def model_units(self) -> tuple[int, ...]:
        return self.base + self.head

    @property
    def policy_units(self) -> int:
        """How many units a freeze policy sees: the model's own, the first ones; the extra units
        an algorithm adds after them (FedROD's personal head) are the algorithm's to freeze."""
        return self.num_units - len(self.extra)


def extra_units(units: Sequence[Unit], extra_modules: Sequence[str]) -> tuple[int, ...]:
    """The units an algorithm added to the model (their modules named in ``extra_modules``)."""
    return tuple(
        i for i, u in enumerate(units) if any(m.split(".")[0] in extra_modules for m in u.modules)
    )


def build_layout(
    units: Sequence[Unit],
    head_units: int = 1,
    sublayers: int | Sequence[Sequence[str]] | None = None,
    extra_modules: Sequence[str] = (),
) -> Layout:
    """Split ``units`` into base sub-layers, head and algorithm-added extra units."""
    extra = extra_units(units, extra_modules)
    model = [i for i in range(len(units)) if i not in extra]
    if head_units < 0 or head_units >= len(model):
        raise ConfigError(
            f"head_units={head_units} leaves no base: the model has {len(model)} units; "
            f"use 0..{len(model) - 1}"
        )
    base = tuple(model[: len(model) - head_units])
    head = tuple(model[len(model) - head_units :])
    groups: tuple[tuple[int, ...], ...]
    if sublayers is None:
        groups = tuple((u,) for u in base)
    elif isinstance(sublayers, int):
        k = sublayers
        if k < 1 or k > len(base):
            raise ConfigError(
                f"sublayers={k} but the base has {len(base)} units; use 1..{len(base)}"
            )
        size, extra_one = divmod(len(base), k)
        groups_list = []
        start = 0
        for g in range(k):
            n = size + (1 if g < extra_one else 0)
            groups_list.append(tuple(base[start : start + n]))
            start += n
        groups = tuple(groups_list)
    else:
        by_name = {u.name: i for i, u in enumerate(units)}
        groups_list = []
        for group in sublayers:
            idx = []
            for name in group:
                if name not in by_name or by_name[name] not in base:
                    raise ConfigError(
                        f"sublayer unit {name!r} is not a base unit; base units: "
                        f"{', '.join(units[i].name for i in base)}"
                    )
                idx.append(by_name[name])
            groups_list.append(tuple(sorted(idx)))
        flat = sorted(i for g in groups_list for i in g)
        if flat != list(base):
            raise ConfigError(
                "sublayers must list every base unit exactly once, input to output; base units: "
                f"{', '.join(units[i].name for i in base)}"
            )
        groups = tuple(groups_list)
    return Layout(len(units), base, head, groups, extra)
