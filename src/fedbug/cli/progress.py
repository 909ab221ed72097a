"""The progress display of the ``fedbug`` commands: on a terminal one bar per run (rich), a bar
per step after the rounds (fine-tuning client by client, writing the summary), and a line per
round of a run on simulated devices; off a terminal (stdout to a file or a pipe, where rich
would show the bars only once the run is over) the same as plain lines, each flushed as it is
written. ``-q`` silences both."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress

RoundFn = Callable[[dict[str, Any]], None]
#: ``on_phase(what, done, total)``, as :data:`fedbug.engine.rounds.PhaseCallback`
PhaseFn = Callable[[str, int, int], None]

#: off a terminal, a step after the rounds gets a line as it starts and ends and at most one
#: every PHASE_EVERY seconds between: a line per client where fine-tuning one takes seconds
#: (so a stalled one shows), a few in all where a hundred clients take a second
PHASE_EVERY = 2.0


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (stdout) is a terminal: bars there, plain lines otherwise."""
    stream = sys.stdout if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def clock(seconds: float) -> str:
    """Seconds as the lines give them: ``12.4 s``, ``2:05.3`` from a minute on."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}:{minutes:02d}:{rest:04.1f}" if hours else f"{minutes}:{rest:04.1f}"


class Lines:
    """Progress as plain lines on stdout, each flushed: a line per round (``tiny seed 0: round
    3/30, acc 25.9%, 12.4 s``: the round, the rounds, the accuracy where the round was
    evaluated, the time since the command started the run) and lines for the steps after the
    rounds (``tiny seed 0: fine-tuning each client 3/20, 1:05.2``)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.last: dict[tuple[str, str], float] = {}  # when each step last had a line

    def say(self, text: str) -> None:
        line(f"{text}, {clock(time.perf_counter() - self.t0)}")

    def round(self, label: str, rec: dict[str, Any], rounds: int) -> None:
        parts = [f"{label}: round {rec['round']}/{rounds}"]
        acc, loss = rec.get("test_acc"), rec.get("test_loss")
        if acc is not None:
            parts.append(f"acc {100 * acc:.1f}%")
        elif loss is not None:
            parts.append(f"loss {loss:.3g}")
        self.say(", ".join(parts))

    def phase(self, label: str, what: str, done: int, total: int) -> None:
        now, key = time.perf_counter(), (label, what)
        if total <= 1:  # one thing to do: said as it starts
            if done == 0:
                self.say(f"{label}: {what}")
            return
        if done in (0, total) or now - self.last.get(key, self.t0) >= PHASE_EVERY:
            self.last[key] = now
            self.say(f"{label}: {what} {done}/{total}")


def line(text: str) -> None:
    """One line on stdout, flushed. Once its reader is gone (``fedbug run ... | head -3``) the
    lines go nowhere and the run goes on to the end, its folder complete, as before it wrote
    them as it went."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # what is still buffered is dropped there
        os.close(devnull)


def _ignore_round(rec: dict[str, Any]) -> None:
    """``-q``: no progress."""


def _ignore_phase(what: str, done: int, total: int) -> None:
    """``-q``: no progress."""


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
        TextColumn("{task.fields[acc]}"),
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
    start: Callable[[RoundFn, PhaseFn], dict[str, Any]],
) -> dict[str, Any]:
    """``start(on_round, on_phase)``, one run (``fedbug run``, or a run of a sequential sweep),
    with its progress: a bar for the rounds and one for each step after them on a terminal,
    plain lines off it, nothing under ``quiet``."""
    if quiet:
        return start(_ignore_round, _ignore_phase)
    if not is_terminal():
        lines = Lines()

        def say_round(rec: dict[str, Any]) -> None:
            lines.round(label, rec, cfg.rounds)
            if rec.get("round_length") is not None:
                line(simulated_line(rec))

        return start(say_round, lambda what, done, total: lines.phase(label, what, done, total))
    with progress_bar(cfg.rounds, label, quiet) as progress:
        task = progress.add_task(label, total=cfg.rounds, acc="acc   -  ")
        steps: dict[str, Any] = {}

        def on_round(rec: dict[str, Any]) -> None:
            acc, loss = rec.get("test_acc"), rec.get("test_loss")
            fields: dict[str, Any]  # the bar's own column (acc), not update's keywords
            if acc is not None:
                fields = {"acc": f"acc {100 * acc:5.1f}%"}
            else:
                fields = {"acc": f"acc loss {loss:.3g}"} if loss is not None else {}
            progress.update(task, completed=rec["round"], **fields)
            if rec.get("round_length") is not None:
                progress.console.print(simulated_line(rec))

        def on_phase(what: str, done: int, total: int) -> None:
            if what not in steps:
                steps[what] = progress.add_task(what, total=total, acc="")
            progress.update(steps[what], completed=done, total=total)

        return start(on_round, on_phase)


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
    per run: its rounds as they come, full when it is done (off a terminal, a line per round of
    each run and one as it is done)."""
    if not quiet and not is_terminal():
        lines = Lines()

        def say_round(i: int, rec: dict[str, Any]) -> None:
            lines.round(jobs[i][1].name, rec, jobs[i][0].rounds)

        def say_done(i: int) -> None:
            lines.say(f"{jobs[i][1].name}: done")

        return start(say_round, say_done)
    with progress_bar(None, "sweep", quiet) as progress:
        bars: dict[int, Any] = {}

        def bar(i: int) -> Any:
            if i not in bars:
                cfg, run_dir = jobs[i]
                bars[i] = progress.add_task(run_dir.name[:40], total=cfg.rounds, acc="acc   -  ")
            return bars[i]

        def on_round(i: int, rec: dict[str, Any]) -> None:
            acc = rec.get("test_acc")
            fields: dict[str, Any] = {"acc": f"acc {100 * acc:5.1f}%"} if acc is not None else {}
            progress.update(bar(i), completed=rec["round"], **fields)

        def on_done(i: int) -> None:
            progress.update(bar(i), completed=jobs[i][0].rounds)

        return start(on_round, on_done)
