"""One round's record: the line of ``metrics.jsonl`` (checksummed as written), and what
``on_round`` and the trackers get. Its keys and their order are fixed here and nowhere else; a
resumed run, the report and the golden tests read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedbug.engine.client import ClientResult


@dataclass
class RoundRecord:
    """What the round loop knows of round ``round`` once it is over.

    ``results`` are the valid updates (in client order), ``dropped`` each client left out with
    why (``{"client", "reason"}``), ``aggregated`` False for a short round skipped under
    ``on_short_round: skip``. ``bytes_down`` is a client's download where its result does not
    count its own (a client's upload is its result's ``bytes_up``). ``evaluated`` holds the
    test figures (None each in a round not evaluated), ``server`` the algorithm's server-side
    figures, ``simulated`` the simulated system's (empty without one). ``count_memory``
    (``count_flops``): the record gives the round's costliest client's memory
    (:func:`peak_mem_fields`)."""

    round: int
    evaluated: dict[str, Any]
    results: list[ClientResult]
    lr: float
    bytes_down: int
    trained_sublayers: list[int]
    client_drift: float
    server: dict[str, Any]
    simulated: dict[str, Any]
    time_train: float
    time_eval: float
    wall_time: float
    dropped: list[dict[str, Any]]
    aggregated: bool
    count_memory: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The record, keys in their order: ``dropped``, ``state_reset`` and ``aggregated``
        only where a client was dropped, a client's state had been lost, the round skipped."""
        results, n = self.results, len(self.results)
        # a result may carry no loss (None: ClientResult's default, a reply without one)
        losses = [x.train_loss for x in results if x.train_loss is not None]
        record: dict[str, Any] = {
            "round": self.round,
            **self.evaluated,
            "train_loss": sum(losses) / len(losses) if losses else None,
            "clients": [x.client for x in results],
            "num_clients": n,
            "lr": self.lr,
            "trained_params": sum(x.trained_params for x in results) / n if n else None,
            "bytes_down": sum(
                x.bytes_down if x.bytes_down is not None else self.bytes_down for x in results
            ),
            "trained_sublayers": self.trained_sublayers,
            "bytes_up": sum(x.bytes_up for x in results),
            "flops": sum(x.flops for x in results),
            **(peak_mem_fields(results) if self.count_memory else {}),
            "client_drift": self.client_drift,
            **self.server,
            **self.simulated,
            "time_train": self.time_train,
            "time_eval": self.time_eval,
            "wall_time": self.wall_time,
        }
        if self.dropped:
            record["dropped"] = self.dropped
        resets = [x.client for x in results if x.state_reset]
        if resets:  # their node had lost their state (a restarted Flower SuperNode)
            record["state_reset"] = resets
        if not self.aggregated:
            record["aggregated"] = False
        return record


def peak_mem_fields(results: list[ClientResult]) -> dict[str, Any]:
    """``peak_mem_bytes``, the largest of the clients' :attr:`~ClientResult.peak_mem` (bytes
    of saved activations, gradients and optimiser state at a client's costliest step), and
    ``peak_mem_parts``, that client's three parts; None each in a round without results."""
    top = max(results, key=lambda x: x.peak_mem, default=None)
    if top is None:
        return {"peak_mem_bytes": None, "peak_mem_parts": None}
    parts = {
        "activations": top.mem_activations,
        "gradients": top.mem_gradients,
        "optimizer": top.mem_optimizer,
    }
    return {"peak_mem_bytes": top.peak_mem, "peak_mem_parts": parts}
