"""The progress display of the ``fedbug`` commands: one bar per run (rich), and a line per
round of a run on simulated devices."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.progress import Progress


def progress_bar(total: int | None, description: str, quiet: bool) -> Progress:
    """The bars of one command (rich, imported here: ``fedbug --help`` does without it); none
    shown under ``quiet``."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        disable=quiet,
        transient=False,
    )


def run_with_bar(
    cfg: Any,
    quiet: bool,
    label: str,
    start: Callable[[Callable[[dict[str, Any]], None]], dict[str, Any]],
) -> dict[str, Any]:
    """``start(on_round)``, one run (``fedbug run``, or a run of a sequential sweep), with its
    progress bar."""
    with progress_bar(cfg.rounds, label, quiet) as progress:
        task = progress.add_task(label, total=cfg.rounds, acc="  -  ")

        def on_round(rec: dict[str, Any]) -> None:
            acc, loss = rec.get("test_acc"), rec.get("test_loss")
            fields: dict[str, Any]  # the bar's own column (acc), not update's keywords
            if acc is not None:
                fields = {"acc": f"{100 * acc:5.1f}%"}
            else:
                fields = {"acc": f"loss {loss:.3g}"} if loss is not None else {}
            progress.update(task, completed=rec["round"], **fields)
            if rec.get("round_length") is not None and not quiet:
                progress.console.print(simulated_line(rec))

        return start(on_round)


def simulated_line(rec: dict[str, Any]) -> str:
    """One round on simulated devices: accuracy, the round's length and the clock in simulated
    time, the soft deadline a freezing policy set, and how many clients froze units (``round 3,
    acc 25.9%, length 1.103, clock 6.70, deadline 0.629, froze 5/10``)."""
    acc = rec.get("test_acc")
    clients = rec.get("per_client") or []
    froze = sum(1 for c in clients if c.get("n_frozen"))
    deadline = rec.get("soft_deadline")
    parts = [
        f"round {rec['round']}",
        f"acc {100 * acc:.1f}%" if acc is not None else "acc -",
        f"length {rec['round_length']:.3f}",
        f"clock {rec['sim_clock']:.2f}",
    ]
    if deadline is not None:
        parts.append(f"deadline {deadline:.3f}")
    parts.append(f"froze {froze}/{len(clients)}")
    return ", ".join(parts)


def with_bars(
    jobs: list[tuple[Any, Path]],
    quiet: bool,
    start: Callable[[Callable[[int, dict[str, Any]], None], Callable[[int], None]], Any],
) -> Any:
    """``start(on_round, on_done)``, which runs the sweep's jobs at once, with a progress bar
    per run: its rounds as they come, full when it is done."""
    with progress_bar(None, "sweep", quiet) as progress:
        bars: dict[int, Any] = {}

        def bar(i: int) -> Any:
            if i not in bars:
                cfg, run_dir = jobs[i]
                bars[i] = progress.add_task(run_dir.name[:40], total=cfg.rounds, acc="  -  ")
            return bars[i]

        def on_round(i: int, rec: dict[str, Any]) -> None:
            acc = rec.get("test_acc")
            fields: dict[str, Any] = {"acc": f"{100 * acc:5.1f}%"} if acc is not None else {}
            progress.update(bar(i), completed=rec["round"], **fields)

        def on_done(i: int) -> None:
            progress.update(bar(i), completed=jobs[i][0].rounds)

        return start(on_round, on_done)
