"""What a client puts into SecAgg+'s secure sum, and the round's aggregate rebuilt from the sum.

Each client sends one vector of the same length (so SecAgg+ can add them), in segments:

- ``delta``: a_i Delta_i over every shared unit, zeros in the units it did not send;
- ``weight``: a_i per unit it sent (or counts in unchanged, ``aggregation: full``), else 0;
- under ``weighting: samples`` also ``raw`` (Delta_i, unweighted) and ``count`` (1 per unit);
- ``sq_norm``: ||Delta_i||^2 / (D c) over what it sent (D the shared space's size, c the clipping
  range: within +-c while no entry is clipped); ``loss``: its train loss / c; each of the two as a
  value on SecAgg+'s grid and the remainder times Q (:func:`two_level`), so their sums are
  precise (within n 2c/Q^2) where one value would be within n 2c/Q, too coarse for a norm;
- each extra tensor (SCAFFOLD's control-variate change), then a 1 that counts it;
- ``clipped``: how many of its values SecAgg+ will clip to +-clipping_range, times
  clipping_range over the vector's length (so the server learns how many values were clipped in
  the round, not whose).

a_i = num_samples / max_weight under ``weighting: samples``, 1 under ``uniform``. The sum over
the round's clients gives every per-unit sum *and* per-unit weight and count the plain
:class:`~fedbug.engine.aggregate.Aggregate` keeps, so partial uploads (FreezeFL) aggregate layer
by layer exactly as in the clear; the server never sees one client's vector. Weights and counts
are sums of integers: they are rounded back to integers, which is exact while the quantisation
error of a sum stays below 1/2 (checked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from fedbug.core.units import ParamSpace
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientResult


@dataclass(frozen=True)
class Layout:
    """The segments of the summed vector, for one run's space, weighting and extras."""

    space: ParamSpace
    weighted: bool  # weighting: samples (a_i = num_samples / max_weight)
    max_weight: float
    extras: tuple[tuple[str, tuple[int, ...]], ...] = ()
    clip: float = 8.0  # SecAgg+'s clipping_range
    levels: int = 4194304  # its quantization_range

    def segments(self) -> list[tuple[str, int]]:
        total, units = self.space.total, self.space.num_units
        seg = [("delta", total), ("weight", units)]
        if self.weighted:
            seg += [("raw", total), ("count", units)]
        seg += [("sq_norm", 2), ("loss", 2)]
        for key, shape in self.extras:
            seg += [(f"extra:{key}", math.prod(shape)), (f"extra-n:{key}", 1)]
        return [*seg, ("clipped", 1)]

    def size(self) -> int:
        return sum(n for _, n in self.segments())

    def split(self, vec: np.ndarray) -> dict[str, np.ndarray]:
        """The named segments of a vector of this layout."""
        out, off = {}, 0
        for name, n in self.segments():
            out[name] = vec[off : off + n]
            off += n
        return out


def extras_layout(extras: dict[str, Tensor]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((k, tuple(extras[k].shape)) for k in sorted(extras))


def two_level(x: float, clip: float, levels: int) -> list[float]:
    """``x`` (clipped to +-clip) as two values within +-clip: the nearest point of SecAgg+'s grid
    (k 2 clip / levels - clip, which its stochastic rounding leaves as it is: exactly where clip
    and levels are powers of 2, as by default) and the remainder times ``levels``. Summed over n
    clients, hi + lo / levels is within n 2 clip / levels^2 of the sum of the x."""
    step = 2.0 * clip / levels
    x = min(max(x, -clip), clip)
    hi = round((x + clip) / step) * step - clip
    return [hi, (x - hi) * levels]


def from_two_level(pair: np.ndarray, levels: int) -> float:
    """The sum :func:`two_level`'s pairs encode."""
    return float(pair[0]) + float(pair[1]) / levels


def client_vector(
    result: ClientResult, layout: Layout, sent: list[bool], counted: list[bool]
) -> np.ndarray:
    """The client's vector (float64): ``sent`` the units whose delta it sends, ``counted`` those
    it counts in with a zero update where it sent nothing (``aggregation: full``); its values
    beyond the clipping range are counted (``clipped``)."""
    space = layout.space
    a = result.num_samples / layout.max_weight if layout.weighted else 1.0
    mask = torch.zeros(space.total, dtype=torch.bool)
    for u, s in enumerate(sent):
        if s:
            mask[space.unit_slices[u]] = True
    delta = torch.where(mask, result.delta, torch.zeros(())).double()
    ind = torch.tensor([float(s or c) for s, c in zip(sent, counted, strict=True)]).double()
    parts: dict[str, Tensor] = {"delta": a * delta, "weight": a * ind}
    if layout.weighted:
        parts |= {"raw": delta, "count": ind}
    c, q = layout.clip, layout.levels
    sq = float(torch.dot(delta, delta)) / (space.total * c)
    loss = float(result.train_loss or 0) / c
    parts["sq_norm"] = torch.tensor(two_level(sq, c, q), dtype=torch.float64)
    parts["loss"] = torch.tensor(two_level(loss, c, q), dtype=torch.float64)
    for key, _ in layout.extras:
        parts[f"extra:{key}"] = result.extras[key].double().reshape(-1)
        parts[f"extra-n:{key}"] = torch.ones(1, dtype=torch.float64)
    names = [name for name, _ in layout.segments()][:-1]
    vec = torch.cat([parts[name].reshape(-1) for name in names])
    clipped = c * float((vec.abs() > c).sum()) / layout.size()  # within +-c
    return torch.cat([vec, torch.tensor([clipped], dtype=torch.float64)]).numpy()


def on_grid(vec: np.ndarray, clip: float, levels: int) -> np.ndarray:
    """``vec`` (clipped to +-clip) as its nearest points of SecAgg+'s grid, then the remainders
    times ``levels`` (:func:`two_level` for a whole vector: ``residual``)."""
    step = 2.0 * clip / levels
    vec = np.clip(vec, -clip, clip)
    hi = np.round((vec + clip) / step) * step - clip
    return np.concatenate([hi, (vec - hi) * levels])


def from_grid(total: np.ndarray, levels: int) -> np.ndarray:
    """The sum :func:`on_grid`'s vectors encode."""
    half = len(total) // 2
    return total[:half] + total[half:] / levels


def _integers(values: np.ndarray, bound: float) -> np.ndarray:
    """Sums of integers back to integers, where the quantisation error allows it."""
    return np.rint(values) if bound < 0.5 else values


class SecureAggregate(Aggregate):
    """An :class:`Aggregate` whose sums are set from SecAgg+'s secure sum (:meth:`set_sum`);
    :meth:`add` counts each client only (its update never reaches the server)."""

    def __init__(self, space: ParamSpace, weighting: Literal["samples", "uniform"]) -> None:
        super().__init__(space, weighting)
        self.mean_loss: float | None = None
        #: values clipped to +-clipping_range in the round, all clients (within the bound)
        self.clipped = 0.0

    def set_sum(self, layout: Layout, total: np.ndarray, clients: int, bound: float) -> None:
        """The round's sum (of ``layout``) over ``clients`` clients whose results are finite;
        ``bound``: the largest quantisation error of one summed value."""
        seg, space, mw = layout.split(total), self.space, layout.max_weight
        scale = mw if layout.weighted else 1.0
        self._wsum = torch.from_numpy(scale * seg["delta"]).float()
        weights = scale * seg["weight"]
        self._unit_w = [float(w) for w in _integers(weights, scale * bound)]
        if layout.weighted:
            self._raw = torch.from_numpy(seg["raw"].copy()).float()
            counts = _integers(seg["count"], bound)
        else:
            self._raw = self._wsum.clone()
            counts = np.array(self._unit_w)
        self._unit_n = [int(c) if float(c).is_integer() else float(c) for c in counts]
        c, q = layout.clip, layout.levels
        self.sq_norm_sum = from_two_level(seg["sq_norm"], q) * space.total * c
        self.mean_loss = from_two_level(seg["loss"], q) * c / clients if clients else None
        self.clipped = float(seg["clipped"][0]) * layout.size() / layout.clip
        for key, shape in layout.extras:
            self._extras[key] = torch.from_numpy(seg[f"extra:{key}"].copy()).float().view(shape)
            self._extra_n[key] = int(_integers(seg[f"extra-n:{key}"], bound)[0])

    def add(
        self,
        delta: Tensor,
        trained: list[bool],
        num_samples: int,
        entries: Tensor | None = None,
        extras: dict[str, Tensor] | None = None,
        counted: list[bool] | None = None,
    ) -> None:
        """Count one client whose vector is in the secure sum (the sums are already set)."""
        self.count += 1
        self.num_samples += num_samples
