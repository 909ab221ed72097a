"""Client-level differential privacy at the server (DP-FedAvg, McMahan et al. 2018; adaptive
clipping, Andrew et al. 2021). Threat model: the server is trusted (DP-FedAvg's central model):
it sees each client's update, clips it on receipt (over the units the client sent: a partial
upload is clipped over what it sends) and releases only the noised aggregate, so what is
protected is the model (and every figure drawn from it) against anyone after the server, not
a client's update against the server. Clipping on receipt is the same as clipping on the client
for the aggregate's privacy, and composes with every executor.

The estimator is DP-FedAvg's fixed-denominator one: (sum_i clip(Delta_i) + N(0, (z C)^2 I)) / m,
m the expected clients per round (q N, or clients_per_round): its sensitivity to one client is
C / m whatever the round drew, whereas dividing by the number that came would make the
denominator itself depend on who took part. Noise is drawn on the entries some client sent
(the units that trained this round, which the schedule fixes, not the data); a unit nobody
sent keeps its value, as without DP.

The noise of round r comes from a generator seeded by (seed, r), so a resumed run draws what the
uninterrupted one did; the adaptive clip is read back from the last record (``dp_clip_next``,
a float that JSON keeps exactly). A deployment wanting real secrecy would seed from the OS.

What the guarantee covers: the weights the server releases and what is computed from them
(test accuracy). The run folder's per-client figures (training loss, sample counts, the
updates' drift) are the trusted server's own log, not noised; so is any server step that reads
the updates other than through their noised sum or mean (FedExp's sum of squared norms).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from fedbug.config.dp import count_noise, expected_clients
from fedbug.core.units import ParamSpace
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.privacy.accountant import Accountant
from fedbug.errors import ConfigError

_DP_STREAM = 0x44_50  # "DP": keeps the noise apart from every other seeded stream


def clip_update(delta: Tensor, sent: Tensor, clip: float) -> tuple[Tensor, float]:
    """``delta`` scaled to L2 norm at most ``clip`` over the entries ``sent`` (bool mask); the
    rest zeroed. Returns (the clipped update, its norm before clipping)."""
    d = torch.where(sent, delta, torch.zeros(()))
    norm = float(torch.linalg.vector_norm(d.double()))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return d * scale, norm


class DPAggregate(Aggregate):
    """A round's aggregate under DP: each update clipped as it is added, uniform weights; after
    :meth:`release` the mean is (sum + noise) / m on the entries sent."""

    def __init__(self, space: ParamSpace, clip: float, expected: float) -> None:
        super().__init__(space, "uniform")
        self.clip, self.expected = clip, expected
        self.norms: list[float] = []
        self._noise: Tensor | None = None

    def add(
        self,
        delta: Tensor,
        trained: list[bool],
        num_samples: int,
        entries: Tensor | None = None,
        extras: dict[str, Tensor] | None = None,
        counted: list[bool] | None = None,
    ) -> None:
        if extras:  # sent beside the delta by a session (sub-model pieces), not just client_extras
            raise ConfigError(
                f"dp: clips and noises the update delta only, and this algorithm also sends "
                f"extra tensors ({', '.join(sorted(extras))}) the server would read unprotected;"
                " use an algorithm that sends one delta (fedavg, fedprox, ...)"
            )
        sent = self.space.unit_mask([u for u, t in enumerate(trained) if t])
        if entries is not None:
            sent &= entries
        clipped, norm = clip_update(delta, sent, self.clip)
        self.norms.append(norm)
        super().add(clipped, trained, num_samples, entries, extras, counted)

    def release(self, std: float, generator: torch.Generator) -> None:
        """Draw N(0, std^2) on every entry some client sent (once; the mean reads it)."""
        held = self.entries_held()
        noise = torch.randn(self.space.total, generator=generator, dtype=torch.float32) * std
        self._noise = torch.where(held, noise, torch.zeros(()))

    def delta_sum(self) -> Tensor:
        """sum_i clip(Delta_i) + noise (the noise once released)."""
        raw = super().delta_sum()
        return raw if self._noise is None else raw + self._noise

    def mean_delta(self, uniform: bool = False) -> Tensor:
        """(sum_i clip(Delta_i) + noise) / m on the entries sent, 0 elsewhere."""
        held = self.entries_held()
        return torch.where(held, self.delta_sum() / self.expected, torch.zeros(()))


class ServerDP:
    """What the server keeps for DP between rounds: the clip (adaptive or fixed) and the
    accountant; each round's aggregate, noise and figures."""

    def __init__(self, cfg: Any, space: ParamSpace) -> None:
        self.cfg, self.params, self.space = cfg, cfg.dp, space
        self.clip = float(self.params.clip)
        self.expected = expected_clients(cfg)
        self.accountant = Accountant(cfg)
        z = self.params.noise_multiplier
        self.update_z = z
        if self.params.adaptive is not None and z > 0:
            # Andrew et al. Thm 1: z_update^-2 + (2 sigma_b)^-2 = z^-2, so the pair spends z
            self.update_z = (z**-2 - (2 * count_noise(cfg)) ** -2) ** -0.5

    def aggregate(self) -> DPAggregate:
        return DPAggregate(self.space, self.clip, self.expected)

    def resume(self, records: list[dict[str, Any]]) -> None:
        """Take the clip and the rounds spent up from the records kept before a resume."""
        for rec in records:
            if rec.get("aggregated", True):
                self.accountant.spend()
            if "dp_clip_next" in rec:
                self.clip = float(rec["dp_clip_next"])

    def generator(self, round: int) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed((self.cfg.seed * 1_000_003 + round * 7919 + _DP_STREAM) % 2**63)
        return g

    def release(self, agg: Aggregate, round: int) -> dict[str, Any]:
        """Noise the round's aggregate (one :meth:`aggregate` made), update the clip, spend the
        round; its figures."""
        if not isinstance(agg, DPAggregate):
            raise TypeError("ServerDP.release takes the aggregate ServerDP.aggregate made")
        g = self.generator(round)
        agg.release(self.update_z * agg.clip, g)
        unclipped = sum(n <= agg.clip for n in agg.norms)
        used = agg.clip
        ad = self.params.adaptive
        if ad is not None:
            noisy = unclipped + float(torch.randn((), generator=g, dtype=torch.float64)) * (
                count_noise(self.cfg) if self.params.noise_multiplier > 0 else 0.0
            )
            self.clip = adapt_clip(used, noisy / self.expected, ad.target_quantile, ad.lr)
        self.accountant.spend()
        return {
            "dp_clip": used,
            "dp_clip_next": self.clip,
            "dp_clipped_fraction": 1.0 - unclipped / len(agg.norms) if agg.norms else 0.0,
            "dp_epsilon": self.accountant.epsilon(),
        }

    def summary(self) -> dict[str, Any]:
        p = self.params
        return {
            "epsilon": self.accountant.epsilon(),
            "delta": p.delta,
            "noise_multiplier": p.noise_multiplier,
            "update_noise_multiplier": self.update_z,
            "clip": self.clip,
            "adaptive": p.adaptive is not None,
            "rounds_spent": self.accountant.rounds,
            "sampling": self.accountant.describe(),
            "estimator": "fixed denominator: (sum of clipped updates + noise) / expected clients",
        }


def adapt_clip(clip: float, unclipped_share: float, target: float, lr: float) -> float:
    """Andrew et al. 2021's geometric update: C exp(-lr (b - target)), b the (noised) share of
    updates no longer than C: too many unclipped shrinks C, too few grows it."""
    return clip * math.exp(-lr * (unclipped_share - target))
