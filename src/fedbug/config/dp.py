"""The ``dp:`` block: client-level differential privacy (DP-FedAvg, McMahan et al. 2018, with
the adaptive clip of Andrew et al. 2021); the ``dp_sgd:`` block: sample-level DP-SGD on each
client (Abadi et al. 2016, through Opacus); and the refusals of configs they cannot cover.

The mechanisms live in :mod:`fedbug.engine.privacy` (``client_level``, ``sample_level``); this
module holds their options only (pydantic, no torch), so the config can validate them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedbug.algorithms import ALGORITHMS
from fedbug.models import is_hf


class AdaptiveClip(BaseModel):
    """Andrew et al. 2021's geometric quantile tracking: C <- C exp(-lr (b - target_quantile)),
    b the noised fraction of clients whose update norm was at most C."""

    model_config = ConfigDict(extra="forbid")
    target_quantile: float = Field(0.5, ge=0.0, le=1.0)
    lr: float = Field(0.2, gt=0.0, le=10.0)
    count_noise: float | None = Field(
        None,
        gt=0.0,
        description="std of the noise on the count of unclipped updates (default: the expected "
        "clients per round / 20, the paper's choice)",
    )


class GaussianNoise(BaseModel):
    """What both DP blocks hold: the clip, the noise multiplier z (the noise std is z * clip)
    and the delta epsilon is reported at; checked under the block's key (``key``)."""

    model_config = ConfigDict(extra="forbid")
    key: ClassVar[str]
    clip: float = Field(1.0, gt=0.0, le=1e6, description="the L2 clip")
    noise_multiplier: float = Field(
        1.0, le=1e6, description="z: the noise std is z * clip (0: clip only, no privacy)"
    )
    delta: float = Field(1e-5, description="the delta epsilon is reported at, in (0, 1)")

    @model_validator(mode="after")
    def _check_noise(self) -> GaussianNoise:
        if self.noise_multiplier < 0:
            raise ValueError(
                f"{self.key}.noise_multiplier={self.noise_multiplier} is negative; give z >= 0"
            )
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"{self.key}.delta={self.delta} is not in (0, 1); give e.g. 1e-5")
        return self


class DPParams(GaussianNoise):
    """Client-level DP: each sent update clipped to L2 norm ``clip`` over the units it sends,
    N(0, (noise_multiplier clip)^2) added to the sum at the server, the sum divided by the
    expected number of clients per round; epsilon at ``delta`` by dp-accounting's RDP
    accountant."""

    key: ClassVar[str] = "dp"
    clip: float = Field(1.0, gt=0.0, le=1e6, description="L2 clip of each sent update")
    adaptive: AdaptiveClip | None = None


class DPSGDParams(GaussianNoise):
    """Sample-level DP-SGD on each client: every sample's gradient over the step's trainable
    units clipped to L2 norm ``clip``, N(0, (noise_multiplier clip)^2) added to their sum, the
    sum divided by the batch size; epsilon per client at ``delta`` (its data set is what is
    protected) by dp-accounting's RDP accountant."""

    key: ClassVar[str] = "dp_sgd"
    clip: float = Field(1.0, gt=0.0, le=1e6, description="L2 clip of each sample's gradient")
    sampling: Literal["poisson", "shuffle"] = Field(
        "poisson",
        description="poisson: each sample joins a step's batch with probability "
        "batch_size / n (what the accountant assumes); shuffle: the usual fixed batches of a "
        "shuffled epoch (Opacus's poisson_sampling=False; the epsilon reported is then the "
        "Poisson one, an approximation)",
    )


def expected_clients(cfg: Any) -> float:
    """The expected number of clients per round: DP-FedAvg's fixed denominator."""
    if cfg.clients_per_round is not None:
        return float(cfg.clients_per_round)
    return cfg.participation * cfg.num_clients


def count_noise(cfg: Any) -> float:
    """The std of the adaptive clip's count noise (the configured one, or m / 20)."""
    ad = cfg.dp.adaptive
    return ad.count_noise if ad.count_noise is not None else expected_clients(cfg) / 20.0


def dp_incompatibility(cfg: Any) -> str | None:
    """Why ``cfg``'s ``dp:`` block cannot be honoured (None: it can, or there is none)."""
    dp = getattr(cfg, "dp", None)
    if dp is None:
        return None
    if cfg.resolved_selection() not in ("bernoulli", "uniform"):
        return (
            f"dp: accounts for clients sampled at random (selection bernoulli or uniform), not "
            f"selection {cfg.resolved_selection()}; choose one of them or remove dp:"
        )
    if cfg.weighting != "uniform":
        return (
            "dp: DP-FedAvg weighs every clipped update 1 (its fixed-denominator estimator); "
            "set weighting: uniform"
        )
    if ALGORITHMS.get(cfg.algorithm).sends_extras(cfg):
        return (
            f"dp: clips and noises the update delta only, and algorithm {cfg.algorithm} also "
            "sends extra tensors beside it the server would read unprotected; "
            "remove dp:, or use an algorithm that sends one delta (fedavg, fedprox, ...)"
        )
    if dp.adaptive is not None and dp.noise_multiplier > 0:
        z, sb = dp.noise_multiplier, count_noise(cfg)
        if (2 * sb) ** -2 >= z**-2:
            return (
                f"dp.adaptive.count_noise={sb:g} leaves no noise for the update under "
                f"noise_multiplier {z:g} (Andrew et al.: it needs count_noise > z/2 = {z / 2:g});"
                " raise count_noise or noise_multiplier"
            )
    return None


def dp_sgd_incompatibility(cfg: Any) -> str | None:
    """Why ``cfg``'s ``dp_sgd:`` block cannot be honoured (None: it can, or there is none).
    The model itself is checked when it is built (Opacus's validator; engine.dp_sgd)."""
    if getattr(cfg, "dp_sgd", None) is None:
        return None
    alg = ALGORITHMS.get(cfg.algorithm)
    if not alg.loss_per_sample:
        return (
            f"dp_sgd: clips each sample's gradient, and algorithm {cfg.algorithm}'s loss reads the "
            "client's whole data set (its class counts or the classes it holds), so one sample "
            "more or less moves every other sample's gradient and the epsilon would not hold; "
            "use an algorithm with a per-sample loss (fedavg, fedprox, ...)"
        )
    if alg.overrides("wrap_model"):
        return (
            f"dp_sgd: Opacus takes per-sample gradients of the model's own layers, and algorithm "
            f"{cfg.algorithm} runs the model through a wrapper of its own (sub-models on "
            "substituted weights, or an added head); use an algorithm that trains the model as "
            "it is (fedavg, fedprox, feddyn, scaffold, ...)"
        )
    if alg.overrides("extra_loss"):
        return (
            f"dp_sgd: clips each sample's gradient, and algorithm {cfg.algorithm} adds a loss "
            "over the whole batch (extra_loss) that has no per-sample gradient; use an "
            "algorithm whose terms act on the weights (fedavg, fedprox, feddyn, scaffold, ...)"
        )
    if is_hf(cfg.model):
        return (
            "dp_sgd: Opacus forms per-sample gradients layer by layer, and a Hugging Face "
            "model's position embedding takes position ids shared by the whole batch (one row), "
            "so its per-sample gradients cannot be formed; train it without dp_sgd (client-level "
            "dp: works), or use a fedbug model"
        )
    if cfg.precision != "fp32":
        return (
            f"dp_sgd: per-sample gradients are computed in float32; precision {cfg.precision} "
            "is not supported with it: set precision: fp32"
        )
    return None
