"""``fedbug repair RUN``: rebuild a run folder's damaged results by running its rounds again.

The same config, seed and versions give the same numbers, so what a damaged metrics line, a
damaged ``summary.json`` or a damaged checkpoint held can be computed again. Repair runs the
folder's ``config.yaml`` from round 1 to the round it must rebuild (the last round of a finished
run; the checkpoint's round of an unfinished one) in a scratch folder, checks that the rerun
reproduces every undamaged line (all but its timings) and, where the checkpoint is whole, its
weights bit for bit, and only then puts the rebuilt files in place; the files it replaces are
kept in ``damaged-<UTC time>/``. When the rerun does not reproduce the run (other versions,
another machine), nothing is changed and the error says so. Lines after an unfinished run's
checkpoint are dropped (``--resume`` does those rounds again).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedbug.config import BaseConfig, config_class, config_hash, load_config, read_config_doc
from fedbug.core.tasks import Task
from fedbug.data import FederatedDataset
from fedbug.engine.experiment import ModelSource
from fedbug.engine.rounds import run_experiment
from fedbug.engine.run_folder import folder_disagreement
from fedbug.errors import CheckpointError, ConfigError, ResultsError
from fedbug.results import RunDir

#: the wall-clock keys of a round record: the only ones a rerun may change
TIMING = frozenset({"time_train", "time_eval", "wall_time"})
SCRATCH = ".repair"


@dataclass
class RepairReport:
    """What ``repair_run`` found and did."""

    run_dir: Path
    damaged: list[str] = field(default_factory=list)
    rebuilt: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    kept_in: Path | None = None
    rounds_rerun: int = 0
    finished: bool = False
    checked: str = "every undamaged round reproduced"  # what the rerun was checked against

    def lines(self) -> list[str]:
        """What to tell the user, one finding a line."""
        where = str(self.run_dir)
        if not self.damaged:
            return [f"{where}: nothing to repair (every file whole)"]
        out = [f"{where}: damaged: {d}" for d in self.damaged]
        out.append(
            f"{where}: rebuilt {', '.join(self.rebuilt)} by running rounds 1-{self.rounds_rerun} "
            f"again ({self.checked})"
        )
        out += [f"{where}: dropped: {d}" for d in self.dropped]
        if self.kept_in is not None:
            out.append(f"{where}: the replaced files are in {self.kept_in}")
        if not self.finished:
            out.append(f"{where}: unfinished: continue it with --resume")
        return out


def repair_run(
    run_dir: Path | str,
    *,
    dataset: FederatedDataset | None = None,
    model: ModelSource = None,
    task: Task | str | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> RepairReport:
    """Rebuild what is damaged in ``run_dir`` (see the module's text); a run built from your
    own data set or model needs them again (``dataset=``, ``model=``, ``task=`` as given to
    :func:`fedbug.run`). Raises :class:`~fedbug.errors.ResultsError` when it cannot."""
    rd = RunDir(Path(run_dir))
    if not rd.config_path.is_file():
        raise ResultsError(
            f"{str(rd.path)!r} holds no config.yaml: not a run folder, or one whose config is "
            "lost (nothing to rebuild from); restore it from a copy"
        )
    rd.acquire_lock()
    try:
        return _repair(rd, (dataset, model, task), on_round)
    finally:
        rd.release_lock()
        shutil.rmtree(rd.path / SCRATCH, ignore_errors=True)


def _config(rd: RunDir, sources: tuple[Any, Any, Any]) -> tuple[BaseConfig, str]:
    """(the config to run again, the run's config hash). A run of the user's own data set or
    model names them ``user:...``: they are given again, and the names put back after
    validation, as the run had them."""
    try:
        doc = read_config_doc(rd.config_path)
        own = {k: doc.get(k) for k in ("dataset", "model") if str(doc.get(k)).startswith("user:")}
        missing = [
            f"{'data set' if k == 'dataset' else 'model'} {v!r}"
            for k, v in own.items()
            if sources[0 if k == "dataset" else 1] is None
        ]
        if missing:
            raise ResultsError(
                f"{str(rd.path)!r} was built from your own {' and '.join(missing)}: repair it "
                "from Python with fedbug.repair(RUN, dataset=..., model=...) giving them again"
            )
        fields = config_class().model_fields
        cfg = load_config(None, doc={**doc, **{k: fields[k].default for k in own}})
    except ConfigError as e:
        raise ResultsError(
            f"{str(rd.config_path)!r} is damaged ({e}); repair needs it: restore it from a copy"
        ) from None
    cfg = cfg.model_copy(update=own)
    chash = config_hash(cfg)
    if cfg.executor.startswith("flower"):  # the same numbers in this process
        cfg = cfg.model_copy(update={"executor": "sequential"})
    return cfg, chash


def _repair(
    rd: RunDir, sources: tuple[Any, Any, Any], on_round: Callable[[dict[str, Any]], None] | None
) -> RepairReport:
    cfg, chash = _config(rd, sources)
    report = RepairReport(rd.path)
    lines, torn = rd.metrics_lines()
    missing = not rd.metrics_path.exists()
    if not (lines or rd.checkpoint_path.exists() or rd.summary_path.exists()):
        raise _never_wrote(rd)
    if missing:  # rebuilt like a cut file, the rerun checked against the checkpoint if whole
        report.damaged.append("metrics.jsonl (missing)")
    for n, (_, problem) in enumerate(lines, start=1):
        if problem is not None:
            report.damaged.append(f"metrics.jsonl line {n} ({problem})")
    ck: dict[str, Any] | None = None
    ck_bad = False
    if rd.checkpoint_path.exists():
        try:
            ck = rd.load_checkpoint()
            if not isinstance(ck, dict) or not isinstance(ck.get("round"), int):
                raise CheckpointError("not a checkpoint of rounds")
            if ck.get("config_hash") != chash:
                raise CheckpointError("written by another config")
        except CheckpointError as e:
            report.damaged.append(f"checkpoint.pt ({e})")
            ck, ck_bad = None, True
    summary_bad = False
    if rd.summary_path.exists():
        try:
            summary = rd.read_summary()
        except ResultsError as e:
            report.damaged.append(f"{e}".split("; ")[0])
            summary_bad = True
        else:
            if summary.get("status") not in (None, "completed"):
                raise ResultsError(
                    f"{str(rd.path)!r} holds a run that {summary.get('status')}: nothing to "
                    "rebuild; run its config again"
                )
            if not report.damaged:
                try:
                    run = rd.read_run()  # the two files against each other (a cut metrics.jsonl)
                except ResultsError as e:
                    report.damaged.append(f"{e}".split("; ")[0])
                else:  # a summary copied from another run, checksum and all
                    what = folder_disagreement(run)
                    if what is not None:
                        report.damaged.append(f"summary.json (disagrees with its folder: {what})")
                        summary_bad = True
    report.finished = rd.summary_path.exists() or (ck is not None and ck["round"] == cfg.rounds)
    if report.finished:
        target = cfg.rounds
    elif ck is not None:
        target = int(ck["round"])
    else:  # the newest round a checkpoint would have been written at
        every = cfg.checkpoint_every
        target = min(cfg.rounds, len(lines) // every * every)
    late = len(lines) - min(target, len(lines))
    if len(lines) < target and not (missing or rd.summary_path.exists()):
        report.damaged.append(
            f"metrics.jsonl holds {len(lines)} whole rounds where checkpoint.pt is at round "
            f"{target}"
        )
    lines = lines + [(None, "missing")] * (target - len(lines))  # rounds a cut file lost
    if not report.damaged:
        return report
    early = [n for n, (_, bad) in enumerate(lines, start=1) if bad and n <= target]
    if not (early or ck_bad or summary_bad):
        # only lines after the checkpoint: --resume does those rounds again
        shutil.copy2(rd.metrics_path, _kept(report))
        rd.truncate_metrics(target)
        report.rebuilt.append("metrics.jsonl")
        report.dropped.append(f"metrics.jsonl's {late + int(torn)} line(s) after round {target}")
        return report
    if target == 0:
        raise ResultsError(
            f"{str(rd.path)!r}: no whole round before its first checkpoint to rebuild; run it "
            "again with --resume (it starts from round 1)"
        )
    report.rounds_rerun = target

    # run it again, beside it, and check that the rerun is this run
    scratch = rd.path / SCRATCH
    shutil.rmtree(scratch, ignore_errors=True)
    dataset, model, task = sources
    again = run_experiment(
        cfg, scratch, dataset=dataset, model=model, task=task, stop_after=target, on_round=on_round
    )
    fresh = RunDir(scratch)
    for n, ((old, _), new) in enumerate(zip(lines[:target], again.records, strict=False), 1):
        if old is None:
            continue
        a = {k: v for k, v in old.items() if k not in TIMING}
        b = {k: v for k, v in new.items() if k not in TIMING}
        if a != b:
            key = next((k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)), "?")
            raise ResultsError(
                f"running {str(rd.config_path)!r} again does not reproduce round {n} ({key}: "
                f"{a.get(key)!r} vs {b.get(key)!r}): the run was made with other versions or on "
                "another machine (summary.json's environment says which); nothing changed"
            )
    same = ck is None or ck["round"] != target
    if not same and not torch.equal(ck["weights"], fresh.load_checkpoint()["weights"]):
        raise ResultsError(
            f"running {str(rd.config_path)!r} again does not reproduce checkpoint.pt's "
            "weights: the run was made with other versions or on another machine; nothing "
            "changed"
        )
    compared = [n for n, (old, _) in enumerate(lines[:target], 1) if old is not None]
    report.checked = {
        (True, True): "every undamaged round and checkpoint.pt's weights reproduced",
        (True, False): "every undamaged round reproduced",
        (False, True): "checkpoint.pt's weights reproduced",
        (False, False): "no undamaged round or checkpoint was left to check it against",
    }[bool(compared), not same]

    # put the rebuilt files in place, the replaced ones kept (a missing one: nothing to keep)
    records = [
        old if old is not None else new
        for (old, _), new in zip(lines[:target], again.records, strict=False)
    ]
    if early or late or torn:  # else its lines are whole and kept as they are
        if not missing:
            shutil.copy2(rd.metrics_path, _kept(report) / rd.metrics_path.name)
        rd.write_metrics(records)
        report.rebuilt.append("metrics.jsonl")
    if late or torn:
        report.dropped.append(f"metrics.jsonl's {late + int(torn)} line(s) after round {target}")
    if ck_bad or ck is None:
        if rd.checkpoint_path.exists():
            rd.checkpoint_path.replace(_kept(report) / rd.checkpoint_path.name)
        fresh.checkpoint_path.replace(rd.checkpoint_path)
        if (scratch / "client_states").is_dir():  # the store the rebuilt checkpoint belongs to
            if (rd.path / "client_states").exists():
                (rd.path / "client_states").replace(_kept(report) / "client_states")
            (scratch / "client_states").replace(rd.path / "client_states")
        report.rebuilt.append("checkpoint.pt")
    if report.finished and (summary_bad or not rd.summary_path.exists()):
        if rd.summary_path.exists():
            rd.summary_path.replace(_kept(report) / rd.summary_path.name)
        summary = fresh.read_summary()
        summary["repaired"] = {"damaged": list(report.damaged), "rounds_rerun": target}
        rd.write_json("summary.json", summary)
        if (scratch / "accuracy.png").exists():
            (scratch / "accuracy.png").replace(rd.path / "accuracy.png")
        report.rebuilt.append("summary.json")
    return report


def _never_wrote(rd: RunDir) -> ResultsError:
    """The error for a run folder without results: no round in metrics.jsonl, no checkpoint,
    no summary (a run refused or killed before its first round ended)."""
    path = str(rd.path)
    head = (
        f"{path!r} holds no results to repair: the run never wrote any (no round in "
        "metrics.jsonl, no checkpoint.pt, no summary.json); run it from round 1"
    )
    error = ResultsError(f"{head} with fedbug.run(cfg, {path!r}, resume=True), or start a new run")
    error.cli_message = (
        f"{head} with fedbug run {rd.config_path} --out {rd.path.parent} --resume, or start a "
        "new run"
    )
    return error


def _kept(report: RepairReport) -> Path:
    """The folder that keeps the files repair replaces."""
    if report.kept_in is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        report.kept_in = report.run_dir / f"damaged-{stamp}"
        report.kept_in.mkdir(exist_ok=True)
    return report.kept_in
