"""The simulated system around one round (FreezeFL Sec. IV-V): per-client round config, times,
clock, the policy's and the selection's feedback."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedbug.engine.client import (
    ClientResult,
)
from fedbug.selection import SelectionFeedback
from fedbug.system import Clock

if TYPE_CHECKING:
    from fedbug.engine.experiment import Experiment


class Simulation:
    """Simulated devices and stateful selection around one round (FreezeFL Sec. IV-V): the
    per-client round config (soft deadline, the time each freezing choice would be charged),
    the clients' times, round length and clock, the deadline update and the selection's
    feedback. Everything it keeps is in :meth:`state_dict` for an exact resume."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.clock = Clock()
        self.participations = [0] * exp.num_clients

    def client_extra(self, client: int) -> dict[str, Any]:
        """Client ``client``'s round config: the algorithm's (a sub-model's width), then the
        policy's (a deadline and the time each freezing choice would be charged)."""
        exp = self.exp
        return {
            **exp.algorithm.client_config(client, exp.system),
            **exp.policy.client_config(client),
        }

    def charged_time(self, res: ClientResult, bytes_down: int) -> float:
        """What client ``res.client`` is charged: the policy's own figure, else its counted
        FLOPs and bytes (or its full-model time when costs are measured). Only on a simulated
        system (:meth:`finish` asks where there is one)."""
        system = self.exp.system
        assert system is not None, "charged_time needs a simulated system"
        if res.charged_time is not None:
            return float(res.charged_time)
        if system.params.cost == "measured":
            return system.full_time(res.client)
        work = res.flops - res.probe_flops
        down = res.bytes_down if res.bytes_down is not None else bytes_down
        return system.time(res.client, work, down, res.bytes_up)

    def finish(
        self, r: int, results: list[ClientResult], bytes_down: int, delta_global: Tensor
    ) -> dict[str, Any]:
        exp = self.exp
        for res in results:
            self.participations[res.client] += 1
        fields: dict[str, Any] = {}
        times: dict[int, float] = {}
        if exp.system is not None:
            times = {res.client: self.charged_time(res, bytes_down) for res in results}
            sent = exp.policy.round_deadline()
            fields["round_length"] = self.clock.advance(list(times.values()))
            fields["sim_clock"] = self.clock.now
            fields["soft_deadline"] = sent
            exp.policy.end_round(list(times.values()))
        exp.selection.update(
            SelectionFeedback(
                round=r,
                clients=[res.client for res in results],
                num_clients=exp.num_clients,
                figures={res.client: dict(res.figures) for res in results},
                num_units=exp.layout.policy_units,
                space=exp.space,
                local_deltas={res.client: res.delta for res in results},
                trained={res.client: res.trained for res in results},
                global_delta=delta_global,
                times=times,
            )
        )
        if exp.system is not None:
            fields["per_client"] = [
                {
                    "id": res.client,
                    "ability": float(exp.system.ability(res.client)),
                    **res.figures,
                    "bytes_down": res.bytes_down if res.bytes_down is not None else bytes_down,
                    "bytes_up": res.bytes_up,
                    "flops": res.flops,
                    "peak_mem": res.peak_mem,
                    "time": times[res.client],
                    "utility": exp.selection.client_utility(res.client),
                }
                for res in results
            ]
        return fields

    def state_dict(self) -> dict[str, Any]:
        exp = self.exp
        return {
            "clock": self.clock.state_dict(),
            "system": exp.system.state_dict() if exp.system is not None else {},
            "policy": exp.policy.state_dict(),
            "selection": exp.selection.state_dict(),
            "participations": torch.tensor(self.participations),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        exp = self.exp
        self.clock.load_state_dict(d["clock"])
        if exp.system is not None:
            exp.system.load_state_dict(d["system"])  # measured costs are not re-timed
        # checkpoints of earlier versions kept any policy's state under "deadline" (FreezeFL's)
        exp.policy.load_state_dict(d["policy"] if "policy" in d else d["deadline"])
        exp.selection.load_state_dict(d["selection"])
        self.participations = [int(x) for x in d["participations"]]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"participations": list(self.participations)}
        system = self.exp.system
        if system is not None:
            out["abilities"] = [float(system.ability(k)) for k in range(self.exp.num_clients)]
            out["full_model_time"] = [system.full_time(k) for k in range(self.exp.num_clients)]
            out["sim_clock"] = self.clock.now
            out.update(self.exp.system_figures)  # what the algorithm made of the system
        return out
