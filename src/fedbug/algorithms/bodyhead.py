"""The body/head split the personalized algorithms (FedBABU, FedPer, LG-FedAvg, FedRep, FedROD)
share: which units are base, head and algorithm-added extras, from the run's :class:`Layout`.

The head is the layout's ``head`` units (config ``head_units``, default 1: the last model unit).
The engine calls :meth:`Algorithm.setup` once the units are known; a runtime built by hand must
too (``alg.setup(build_layout(units, ...))``).
"""

from __future__ import annotations

from fedbug.algorithms.fedavg import FedAvg
from fedbug.core.layout import Layout


class BodyHead(FedAvg):
    """FedAvg with the layout's base, head and extra units at hand."""

    splits_body_head = True

    @property
    def split(self) -> Layout:
        if self.layout is None:
            raise RuntimeError(
                f"{self.name} needs the model's base/head layout: call setup(layout) first"
            )
        return self.layout

    def _check(self, num_units: int) -> Layout:
        lay = self.split
        if lay.num_units != num_units:
            raise ValueError(
                f"{self.name}: the layout has {lay.num_units} units but the model {num_units}; "
                "call setup() with this model's layout"
            )
        return lay
