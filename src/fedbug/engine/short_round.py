"""A round with too few valid updates (``min_results``): its count, the reasons clients gave
none, the fixes to suggest, and the one-line error or summary block that says so."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedbug.config import BaseConfig
from fedbug.engine.checks import is_divergence
from fedbug.errors import ShortRoundError

if TYPE_CHECKING:
    from fedbug.engine.executors import Executor


@dataclass
class ShortRound:
    """One round's count of updates: ``selected`` clients asked, ``reported`` valid updates,
    ``required`` needed to aggregate, and each client ``dropped`` with why."""

    round: int
    selected: int
    reported: int
    required: int
    dropped: list[dict[str, Any]]

    @classmethod
    def of_record(cls, record: dict[str, Any], executor: Executor, cfg: BaseConfig) -> ShortRound:
        """The count of a round from its record (a round run before a resume)."""
        dropped = list(record.get("dropped") or [])
        reported = int(record.get("num_clients") or 0)
        selected = reported + len(dropped)
        required = executor.required(selected, cfg.min_results)
        return cls(record["round"], selected, reported, required, dropped)

    def why(self) -> str:
        """The reasons the updates are missing, each once with its count (``2 x no reply
        within round_timeout (600 s)``)."""
        counts: dict[str, int] = {}
        for d in self.dropped:
            reason = str(d.get("reason"))
            reason = reason if len(reason) <= 160 else reason[:157] + "..."
            counts[reason] = counts.get(reason, 0) + 1
        unexplained = self.selected - self.reported - len(self.dropped)
        if unexplained > 0:
            counts["no update and no reason given"] = unexplained
        shown = [f"{n} x {reason}" for reason, n in list(counts.items())[:3]]
        if len(counts) > 3:
            shown.append(f"{len(counts) - 3} other reason(s), in the summary")
        return ", ".join(shown) if shown else "none dropped"

    def fixes(self, cfg: BaseConfig, every_round: bool = False) -> str:
        """What to change, from the reasons (and the config)."""
        reasons = [str(d.get("reason")) for d in self.dropped]
        fixes = []
        if any("round_timeout" in x for x in reasons):
            fixes.append(f"raise flower.round_timeout (now {cfg.flower.round_timeout:g} s)")
        if any(is_divergence(x) for x in reasons):
            fixes.append(f"lower lr (updates were non-finite at lr={cfg.lr:g})")
        if any(x.startswith("error reply") for x in reasons):
            fixes.append("fix the clients' error (the SuperNodes' logs have it)")
        if self.required > self.selected:
            fixes.append(f"lower min_results (a round selects {self.selected})")
        if not every_round:
            fixes.append("set on_short_round: skip to go on without such rounds")
        elif not fixes:
            fixes.append("each round's dropped clients in metrics.jsonl say why")
        text = ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + fixes[-1]
        return text[:1].upper() + text[1:]

    def error(self, cfg: BaseConfig, every_round: bool = False) -> ShortRoundError:
        key = "min_results"
        if cfg.executor.startswith("flower") and cfg.flower.min_results is not None:
            key = "flower.min_results"
        counted = (
            f"{self.reported} of {self.selected} selected clients gave a valid update, fewer "
            f"than {key} ({self.required}): {self.why()}"
        )
        if every_round:
            text = (
                f"no round was aggregated: each of the {cfg.rounds} rounds had too few valid "
                f"updates (the last, round {self.round}: {counted}); the model is the untrained "
                f"one, so the run is not completed. {self.fixes(cfg, every_round=True)}"
            )
        else:
            text = (
                f"round {self.round}: {counted}; the run stopped there (the rounds before are "
                f"kept). {self.fixes(cfg)}"
            )
        return ShortRoundError(text, self.round, self.reported, self.selected, self.required)

    def block(self, message: str) -> dict[str, Any]:
        """summary.json's ``short_round`` block of a run this round stopped."""
        return {**dataclasses.asdict(self), "message": message}
