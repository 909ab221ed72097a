"""The server's side of DP-SGD (``dp_sgd:``): the privacy each client's data has spent, from the
local steps of its updates that reached the server, recorded per round (``dp_sgd_epsilon``, the
worst client so far; ``dp_sgd_steps``, the round's steps by client, which a resume reads back)
and in the summary. The client's side is :mod:`fedbug.engine.privacy.sample_level`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedbug.core.protocol import ClientResult
from fedbug.engine.privacy.accountant import SampleAccountant


class ClientPrivacy:
    """Epsilon per client under DP-SGD (see the module docstring)."""

    def __init__(self, cfg: Any, sizes: Sequence[int]) -> None:
        self.params = cfg.dp_sgd
        self.sizes = sizes
        self.accountant = SampleAccountant(
            self.params.noise_multiplier, self.params.delta, cfg.batch_size
        )

    def spend(self, results: list[ClientResult]) -> dict[str, Any]:
        """Charge each result's steps (its discarded probe's too: they saw the data); the
        round's figures."""
        steps = {r.client: r.steps + r.probe_steps for r in results}
        for client, n in steps.items():
            self.accountant.spend(client, self.sizes[client], n)
        return {
            "dp_sgd_epsilon": self.accountant.worst(),
            "dp_sgd_steps": {str(c): n for c, n in sorted(steps.items())},
        }

    def resume(self, records: list[dict[str, Any]]) -> None:
        """Charge the steps the records kept before a resume."""
        for rec in records:
            for client, n in (rec.get("dp_sgd_steps") or {}).items():
                self.accountant.spend(int(client), self.sizes[int(client)], int(n))

    def summary(self) -> dict[str, Any]:
        p = self.params
        return {
            **self.accountant.spread(),
            "delta": p.delta,
            "noise_multiplier": p.noise_multiplier,
            "clip": p.clip,
            "sampling": p.sampling,
            "accountant": "RDP (dp-accounting), Poisson-sampled Gaussian per local step, "
            "q = batch_size / n per client"
            + ("" if p.sampling == "poisson" else " (shuffled batches: an approximation)"),
        }
