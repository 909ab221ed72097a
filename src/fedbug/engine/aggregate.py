"""The server's running aggregate of one round's client updates.

Updates are added in ascending client id; each unit is averaged over the clients that trained it
(weighted by sample count or uniformly), so partial uploads and frozen units need nothing
special: a unit nobody trained gets a zero mean update and keeps its value. An update may also
say which entries of its units it holds (``entries``, Fjord's sub-model): from then on each entry
is averaged over the clients that hold it (FjORD's ordered-dropout aggregation). Extra tensors a
client sends (``extras``, e.g. SCAFFOLD's control-variate change) are summed per key in client
order (:meth:`Aggregate.extra_sum`, :meth:`Aggregate.extra_count`).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from fedbug.core.units import ParamSpace

#: how a client's update is weighted in the mean (the config's ``weighting``)
WEIGHTINGS = ("samples", "uniform")


class Aggregate:
    def __init__(self, space: ParamSpace, weighting: Literal["samples", "uniform"]) -> None:
        if weighting not in WEIGHTINGS:  # never a silent plain mean for a weighting not known
            raise ValueError(f"weighting {weighting!r} is not one of {', '.join(WEIGHTINGS)}")
        self.space = space
        self.weighting = weighting
        self._wsum = torch.zeros(space.total)
        self._raw = torch.zeros(space.total)
        self._unit_w = [0.0] * space.num_units
        # a count per unit (a secure sum's may be fractional: SecureAggregate.set_sum)
        self._unit_n: list[float] = [0] * space.num_units
        self.sq_norm_sum = 0.0
        self.count = 0
        self.num_samples = 0
        # per-entry weight and count, kept from the first update that names its entries
        self._entry_w: Tensor | None = None
        self._entry_n: Tensor | None = None
        self._extras: dict[str, Tensor] = {}
        self._extra_n: dict[str, int] = {}

    def add(
        self,
        delta: Tensor,
        trained: list[bool],
        num_samples: int,
        entries: Tensor | None = None,
        extras: dict[str, Tensor] | None = None,
        counted: list[bool] | None = None,
    ) -> None:
        """Add one client's update (full-length; entries of untrained units are ignored).

        ``entries`` (bool, full-length): the entries this client holds (its other entries of
        the trained units must be 0 in ``delta``); None: all of them. ``counted``: units this
        client counts in unchanged where it sent nothing (``aggregation: full``), so they
        weigh in the mean as a zero update whatever its local copy of them did (a frozen
        BatchNorm's running statistics drift in training; the server never sees them)."""
        w = float(num_samples) if self.weighting == "samples" else 1.0
        if entries is not None and self._entry_w is None:
            self._entry_w = torch.zeros(self.space.total)
            self._entry_n = torch.zeros(self.space.total)
            for u, s in enumerate(self.space.unit_slices):  # the updates added so far
                self._entry_w[s] = self._unit_w[u]
                self._entry_n[s] = self._unit_n[u]
        for u, t in enumerate(trained):
            if not (t or (counted is not None and counted[u])):
                continue
            s = self.space.unit_slices[u]
            self._unit_w[u] += w
            self._unit_n[u] += 1
            if self._entry_w is not None and self._entry_n is not None:
                held = entries[s].float() if entries is not None else 1.0
                self._entry_w[s] += w * held
                self._entry_n[s] += held
            if t:
                self._wsum[s].add_(delta[s], alpha=w)
                self._raw[s].add_(delta[s])
                d = delta[s].double()
                self.sq_norm_sum += float(torch.dot(d, d))  # what was sent, nothing else
        for key, value in (extras or {}).items():
            if key in self._extras:
                self._extras[key] = self._extras[key] + value
            else:
                self._extras[key] = value.clone()
            self._extra_n[key] = self._extra_n.get(key, 0) + 1
        self.count += 1
        self.num_samples += num_samples

    def mean_delta(self, uniform: bool = False) -> Tensor:
        """Per unit: sum_i w_i Delta_i / sum_i w_i over the clients that sent the unit
        (``uniform``: the plain mean over them, whatever the weighting); per entry, over the
        clients holding it, once an update has named its entries (0 where none does)."""
        if self._entry_w is not None and self._entry_n is not None:
            num, den = (self._raw, self._entry_n) if uniform else (self._wsum, self._entry_w)
            return torch.where(den > 0, num / den.clamp_min(1e-30), torch.zeros(()))
        out = torch.zeros(self.space.total)
        for u, (w, n) in enumerate(zip(self._unit_w, self._unit_n)):
            if n > 0:
                s = self.space.unit_slices[u]
                out[s] = self._raw[s] / n if uniform else self._wsum[s] / w
        return out

    def entries_held(self) -> Tensor:
        """Bool over the flat space: the entries at least one added update holds."""
        if self._entry_n is not None:
            return self._entry_n > 0
        held = torch.zeros(self.space.total, dtype=torch.bool)
        for u, n in enumerate(self._unit_n):
            if n > 0:
                held[self.space.unit_slices[u]] = True
        return held

    def extra_sum(self, key: str) -> Tensor | None:
        """The sum over the added updates of their extra tensor ``key`` (None: none sent one)."""
        return self._extras.get(key)

    def extra_count(self, key: str) -> int:
        """How many added updates sent an extra tensor ``key``."""
        return self._extra_n.get(key, 0)

    def delta_sum(self) -> Tensor:
        """sum_i Delta_i (unweighted, over all units)."""
        return self._raw

    def units_trained_by(self) -> list[float]:
        return list(self._unit_w)

    def client_drift(self) -> float:
        """Spread of the updates around their (uniform) mean: sqrt(mean_i ||Delta_i - mean||^2)."""
        if self.count == 0:
            return 0.0
        mean = self._raw.double() / self.count
        var = self.sq_norm_sum / self.count - float(torch.dot(mean, mean))
        return math.sqrt(max(var, 0.0))
