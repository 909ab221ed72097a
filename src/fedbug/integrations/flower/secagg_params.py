"""The ``flower.secagg`` block: secure aggregation by Flower's own SecAgg+ (pydantic only, no
``flwr``; read by the Flower executors, refused elsewhere by :mod:`fedbug.config.secagg`).

The options mirror :class:`flwr.server.workflow.SecAggPlusWorkflow`'s arguments, with its
defaults (``num_shares`` and ``reconstruction_threshold``, which it has none for: those of
Flower's SecAgg+ example, 3 and 2).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SecAggParams(BaseModel):
    """Flower's SecAgg+ (``SecAggPlusWorkflow``): each sent value x is clipped to [-c, c]
    (c = clipping_range), mapped to (x + c) Q / (2c) (Q = quantization_range) and rounded
    stochastically to an integer (up or down, unbiased), masked, and the integers summed modulo
    modulus_range; the server subtracts the n clients' offsets and scales back.

    The error bound (:meth:`sum_bound`): each client moves each value by less than one level,
    step = 2c/Q (none for a value on the grid, e.g. an unsent unit's 0 when Q is even), so a sum
    over n clients is within n * step of the sum of the clipped values. With the defaults
    (c = 8, Q = 2^22) step = 3.8e-6. Per-unit weights and counts are sums of integers and come
    back exact while their error stays below 1/2; a unit's mean update is then within
    n * step * s / W_u (W_u its exact weight; s = max_weight under weighting: samples, else 1).
    Values beyond +-c are clipped: keep c above the largest |update entry| (times
    num_samples / max_weight under weighting: samples)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_shares: int | float = Field(
        3,
        gt=0,
        description="shares each client's secrets are split into (its neighbours + itself); "
        "a float: that fraction of the round's clients",
    )
    reconstruction_threshold: int | float = Field(
        2,
        gt=0,
        description="shares needed to rebuild a secret (int < num_shares, or a fraction in "
        "(0, 1] of num_shares)",
    )
    max_weight: float = Field(
        1000.0,
        gt=0.0,
        le=1e12,
        description="weighting: samples: a client's update is scaled by num_samples / "
        "max_weight before quantisation (keep it at least the largest client)",
    )
    clipping_range: float = Field(
        8.0, gt=0.0, le=1e9, description="each sent value is clipped to +-clipping_range"
    )
    quantization_range: int = Field(
        4194304,
        ge=2,
        le=2**31 - 1,  # SecAgg+ quantises to int32
        description="integer levels over [-clipping_range, clipping_range]",
    )
    modulus_range: int = Field(
        4294967296, ge=4, le=4294967296, description="the masks' modulus (a power of 2, <= 2^32)"
    )
    residual: bool = Field(
        False,
        description="also send each value's remainder from SecAgg+'s grid, times "
        "quantization_range: the sums' error falls from n 2c/Q to n 2c/Q^2, at twice the "
        "upload (clipping_range and quantization_range powers of 2)",
    )
    timeout: float | None = Field(
        None,
        gt=0.0,
        le=1e7,
        description="seconds each of SecAgg+'s four stages waits for replies (default: "
        "flower.round_timeout)",
    )

    @model_validator(mode="after")
    def _check(self) -> SecAggParams:
        m, q = self.modulus_range, self.quantization_range
        if m & (m - 1):
            raise ValueError(
                f"flower.secagg.modulus_range={m} is not a power of 2; give e.g. 2**32"
            )
        if q >= m:
            raise ValueError(
                f"flower.secagg.quantization_range={q} must be below modulus_range={m}"
            )
        if self.residual and not (_power_of_2(self.clipping_range) and _power_of_2(q)):
            raise ValueError(
                "flower.secagg.residual needs clipping_range and quantization_range powers of "
                f"2 (their grid is then exact in float64), not {self.clipping_range:g} and {q}"
            )
        t, s = self.reconstruction_threshold, self.num_shares
        if isinstance(t, float) and t > 1:
            raise ValueError(
                f"flower.secagg.reconstruction_threshold={t} as a fraction must be in (0, 1]"
            )
        if isinstance(s, int) and s == 2:
            raise ValueError("flower.secagg.num_shares=2 is refused by SecAgg+; give 3 or more")
        if isinstance(t, int) and isinstance(s, int) and t != 1 and s != 1 and t >= s:
            raise ValueError(
                f"flower.secagg.reconstruction_threshold={t} must be below num_shares={s}"
            )
        return self

    @property
    def step(self) -> float:
        """The width of one quantisation level: 2 clipping_range / quantization_range."""
        return 2.0 * self.clipping_range / self.quantization_range

    def sum_bound(self, clients: int) -> float:
        """The largest error of one summed value over ``clients`` clients (each value within
        +-clipping_range): each client's stochastic rounding moves it by less than one level;
        under ``residual`` the value's grid point passes exactly and its remainder, times Q,
        is off by less than a level, so the value by less than step / Q."""
        return clients * self.step / (self.quantization_range if self.residual else 1)


def _power_of_2(x: float) -> bool:
    return x > 0 and math.frexp(x)[0] == 0.5
