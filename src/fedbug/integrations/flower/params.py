"""The ``flower:`` block of a config (read by the Flower executors only; no ``flwr`` import)."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from fedbug.integrations.flower.secagg_params import SecAggParams


class FlowerParams(BaseModel):
    """Where the SuperLink is and how long a round waits for replies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    superlink: str | None = Field(
        None,
        description="deployment: the SuperLink's HOST:PORT (its one HTTP port, default 8000) "
        "or a connection name in $FLWR_HOME/config.toml",
    )
    root_certificates: str | None = Field(
        None, description="deployment: the CA certificate of a TLS SuperLink (else insecure)"
    )
    round_timeout: float = Field(
        600.0, gt=0.0, le=1e7, description="seconds a round waits for replies; late = dropped"
    )
    min_results: float | None = Field(
        None,
        gt=0.0,
        description="fewer replies: the round is not aggregated; a count (>= 1) or a fraction "
        "(< 1) of the selected clients; default the config's min_results",
    )
    num_cpus: float | None = Field(
        None, gt=0.0, le=1024, description="simulation: CPUs a client (default threads)"
    )
    supernodes: int | None = Field(
        None,
        ge=1,
        description="simulation: virtual SuperNodes, each training any client (default "
        "min(clients, 16))",
    )
    poll_interval: float = Field(
        0.2,
        gt=0.0,
        le=60.0,
        description="the longest wait between pulls; waits start at 10 ms and grow by half "
        "each pull, so short rounds are not rounded up to a poll",
    )
    secagg: SecAggParams | None = Field(
        None,
        description="secure aggregation by Flower's SecAgg+: the server sees only the round's "
        "sum (num_shares, reconstruction_threshold, max_weight, clipping_range, "
        "quantization_range, modulus_range, timeout)",
    )

    def required(self, selected: int, default: int) -> int:
        """Replies a round needs to be aggregated, for ``selected`` clients."""
        if self.min_results is None:
            return default
        if self.min_results >= 1:
            return int(self.min_results)
        return max(1, math.ceil(self.min_results * selected))
