"""``fedbug repair RUN``: rebuild a run folder's damaged results by running its rounds again.

The same config, seed and versions give the same numbers, so what a damaged metrics line, a
damaged ``summary.json`` or a damaged checkpoint held can be computed again. Repair runs the
folder's ``config.yaml`` from round 1 to the round it must rebuild (the last round of a finished
run; the checkpoint's round of an unfinished one) in a scratch folder, checks that the rerun
reproduces every undamaged line (all but its timings) and, where the checkpoint is whole, its
weights bit for bit, and only then puts the rebuilt files in place; the files it replaces are
kept in ``damaged-<UTC time>/``. When the rerun does not reproduce the run (other versions,
another machine), nothing is changed and the error says so. Lines after an unfinished run's
checkpoint are cut, no round run again (``--resume`` does those rounds); damage in a run stopped
before its first checkpoint is refused (there is no round to rebuild to: ``--resume`` runs it
again from round 1). ``checkpoint.pt`` is read under the size limit ``--resume`` reads it under
(:func:`~fedbug.results.limits.checkpoint_limit`, the model counted on the meta device): a
larger file is damage, rebuilt without a byte of it read.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedbug.config import BaseConfig, config_class, config_hash, load_config, read_config_doc
from fedbug.core.tasks import Task
from fedbug.data import FederatedDataset, load_dataset
from fedbug.engine.experiment import ModelSource
from fedbug.engine.rounds import run_experiment
from fedbug.engine.run_folder import folder_disagreement
from fedbug.errors import CheckpointError, ConfigError, ResultsError
from fedbug.models import build_model, is_import_path, model_kwargs
from fedbug.models.size import count_params, tensor_count
from fedbug.results import RunDir
from fedbug.results.limits import checkpoint_limit

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
    rounds_rerun: int = 0  # 0: no round was run again
    finished: bool = False
    checked: str = "every undamaged round reproduced"  # what the rerun was checked against
    cut: bool = False  # metrics.jsonl cut after ``last_round``, no round run again
    last_round: int = 0  # the last round the folder holds once repaired
    rounds: int = 0  # the run's rounds, as its config says
    torn: bool = False  # metrics.jsonl ends in a torn line (a killed run's: --resume drops it)

    def lines(self) -> list[str]:
        """What to tell the user, one finding a line."""
        where = str(self.run_dir)
        if not self.damaged and self.torn:
            return [
                f"{where}: nothing to repair (metrics.jsonl ends in a torn last line, as a "
                "killed run leaves it: --resume drops it)"
            ]
        if not self.damaged:
            return [f"{where}: nothing to repair (every file whole)"]
        out = [f"{where}: damaged: {d}" for d in self.damaged]
        if self.rounds_rerun:
            out.append(
                f"{where}: rebuilt {', '.join(self.rebuilt)} by running rounds "
                f"1-{self.rounds_rerun} again ({self.checked})"
            )
        if self.cut:
            whose = "the run's last" if self.finished else "checkpoint.pt's"
            out.append(
                f"{where}: cut metrics.jsonl after round {self.last_round} ({whose}); no round "
                "was run again"
            )
        out += [f"{where}: dropped: {d}" for d in self.dropped]
        if self.kept_in is not None:
            out.append(f"{where}: the replaced files are in {self.kept_in}")
        if not self.finished:
            out.append(
                f"{where}: unfinished: continue it with --resume (it runs rounds "
                f"{self.last_round + 1}-{self.rounds})"
            )
        return out


def repair_target(run_dir: Path | str) -> RunDir:
    """``run_dir`` as a run folder :func:`repair_run` can rebuild from (it holds its
    ``config.yaml``); else :class:`~fedbug.errors.ResultsError` saying what it is instead."""
    rd = RunDir(Path(run_dir))
    if not rd.path.exists():
        raise ResultsError(
            f"{str(rd.path)!r} does not exist; give a run folder (one that fedbug run made "
            "under its --out, holding config.yaml)"
        )
    if not rd.path.is_dir():
        raise ResultsError(f"{str(rd.path)!r} is a file, not a run folder; give its folder")
    runs = sorted(p.parent.name for p in rd.path.glob("*/config.yaml"))
    if not rd.config_path.is_file() and runs:
        raise ResultsError(
            f"{str(rd.path)!r} is a folder of {len(runs)} runs (a sweep's, or --out), not a run "
            f"folder; repair each: fedbug repair {str(rd.path / '*')}"
        )
    if not rd.config_path.is_file():
        raise ResultsError(
            f"{str(rd.path)!r} holds no config.yaml: not a run folder, or one whose config is "
            "lost (nothing to rebuild from); restore it from a copy"
        )
    return rd


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
    rd = repair_target(run_dir)
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


#: a metrics.jsonl line as ``RunDir.metrics_lines`` gives it: (record or None, its problem or None)
_Line = tuple[dict[str, Any] | None, str | None]

#: what the rerun was checked against, by (an undamaged round compared, the weights compared)
_CHECKED = {
    (True, True): "every undamaged round and checkpoint.pt's weights reproduced",
    (True, False): "every undamaged round reproduced",
    (False, True): "checkpoint.pt's weights reproduced",
    (False, False): "no undamaged round or checkpoint was left to check it against",
}


@dataclass
class _Found:
    """What repair found in a run folder, before it changes anything."""

    report: RepairReport
    lines: list[_Line]  # metrics.jsonl's whole lines; padded with missing ones up to ``target``
    torn: bool  # a torn last line follows them
    missing: bool  # no metrics.jsonl at all
    ck: dict[str, Any] | None = None  # the checkpoint, when whole and written by this config
    ck_bad: bool = False  # damaged, or missing from a finished run
    summary_bad: bool = False
    target: int = 0  # the round to rebuild
    late: int = 0  # whole lines after it
    whole: int = 0  # whole lines in metrics.jsonl

    @property
    def torn_after(self) -> bool:
        """A torn last line after the round to rebuild (one in its place is rebuilt)."""
        return self.torn and self.whole >= self.target

    @property
    def early(self) -> list[int]:
        """The damaged lines up to the round to rebuild (1-based)."""
        return [n for n, (_, bad) in enumerate(self.lines, start=1) if bad and n <= self.target]


def _repair(
    rd: RunDir, sources: tuple[Any, Any, Any], on_round: Callable[[dict[str, Any]], None] | None
) -> RepairReport:
    """Find the damage; then nothing to do, or cut the lines after the checkpoint, or run the
    rounds again, check the rerun against the run, and put the rebuilt files in place."""
    cfg, chash = _config(rd, sources)
    found = _survey(rd, cfg, chash, sources)
    report = found.report
    if not report.damaged:
        return report
    report.last_round = found.target
    if found.target == 0:
        raise _nothing_to_rebuild_to(rd, found)
    if not (found.early or found.ck_bad or found.summary_bad):
        return _drop_late_lines(rd, found)
    report.rounds_rerun = found.target
    records, fresh = _rerun(rd, cfg, sources, found.target, on_round)
    _check_rerun(rd, found, records, fresh)
    _replace_metrics(rd, found, records)
    _replace_checkpoint(rd, found, fresh)
    _replace_summary(rd, found, fresh)
    return report


def _survey(rd: RunDir, cfg: BaseConfig, chash: str, sources: tuple[Any, Any, Any]) -> _Found:
    """Every damaged file or line (each noted in the report) and the round to rebuild; raises
    when there is nothing to rebuild from. Changes nothing."""
    lines, torn = rd.metrics_lines()
    report = RepairReport(rd.path, rounds=cfg.rounds)
    report.torn = torn
    found = _Found(report, lines, torn, missing=not rd.metrics_path.exists(), whole=len(lines))
    if not (lines or rd.checkpoint_path.exists() or rd.summary_path.exists()):
        raise _never_wrote(rd)
    _note_damaged_lines(found)
    found.ck, found.ck_bad = _checkpoint(rd, cfg, chash, sources, found.report)
    found.report.finished = _finished(rd, cfg, found.ck)
    found.target = _target_round(cfg, found)
    _note_short(found)
    found.summary_bad = _summary_damaged(rd, found.report)
    _note_missing_checkpoint(rd, found)
    _note_torn_after(found)
    found.late = len(lines) - min(found.target, len(lines))
    found.lines = lines + [(None, "missing")] * (found.target - len(lines))  # what a cut file lost
    return found


def _note_damaged_lines(found: _Found) -> None:
    """A missing metrics.jsonl (rebuilt like a cut file, the rerun checked against the
    checkpoint if whole) and each damaged line, in the report."""
    if found.missing:
        found.report.damaged.append("metrics.jsonl (missing)")
    for n, (_, problem) in enumerate(found.lines, start=1):
        if problem is not None:
            found.report.damaged.append(f"metrics.jsonl line {n} ({problem})")


def _note_short(found: _Found) -> None:
    """Fewer whole lines than the round to rebuild (a cut file, or a torn line in place of a
    round), in the report; noted before the summary's check, which it skips."""
    n, target = found.whole, found.target
    if n >= target or found.missing:
        return
    torn = " and a torn last line" if found.torn else ""
    where = (
        f"the run's last round is {target}"
        if found.report.finished
        else f"checkpoint.pt is at round {target}"
    )
    found.report.damaged.append(f"metrics.jsonl holds {n} whole rounds{torn} where {where}")


def _note_torn_after(found: _Found) -> None:
    """A finished run's torn last line after its last round, in the report (it is cut): an
    unfinished run's is what a killed run leaves, dropped by ``--resume``."""
    if found.report.finished and found.torn_after:
        found.report.damaged.append(
            f"metrics.jsonl line {found.whole + 1} (torn: no newline at its end; after round "
            f"{found.target}, the run's last)"
        )


def _checkpoint(
    rd: RunDir, cfg: BaseConfig, chash: str, sources: tuple[Any, Any, Any], report: RepairReport
) -> tuple[dict[str, Any] | None, bool]:
    """(the checkpoint, when whole and written by this config; whether it is damaged, as
    noted in the report). It is read under the limit ``--resume`` reads it under
    (:func:`_checkpoint_limit`): a larger file, which no run of this config writes, is damage,
    not read."""
    if not rd.checkpoint_path.exists():
        return None, False
    limit = _checkpoint_limit(cfg, sources)
    size = rd.checkpoint_path.stat().st_size
    if size > limit:
        more = f"more than this run writes there (at most {limit:,})"
        report.damaged.append(f"checkpoint.pt ({size:,} bytes, {more}: not read)")
        return None, True
    try:
        ck = rd.load_checkpoint(limit)
        if not isinstance(ck, dict) or not isinstance(ck.get("round"), int):
            raise CheckpointError("not a checkpoint of rounds")
        if ck.get("config_hash") != chash:
            raise CheckpointError("written by another config")
    except CheckpointError as e:
        report.damaged.append(f"checkpoint.pt ({_what(e)})")
        return None, True
    return ck, False


def _checkpoint_limit(cfg: BaseConfig, sources: tuple[Any, Any, Any]) -> int:
    """The most bytes ``cfg``'s checkpoint.pt may take: :func:`~fedbug.results.limits.
    checkpoint_limit` of its clients and its weights' bytes, 4 a value (the flat float32
    vector ``--resume`` sizes it by), the values counted on the meta device as the model's
    size limit counts them (:func:`~fedbug.models.size.count_params`): the data set is loaded
    for its input shape and classes, no weight is made. The model is counted bare: the
    algorithm's own parts (FedROD's personal head, a copy of the classifier) at most double
    it, which the limit's factor 2 holds. A model of the user's own that cannot be built on
    the meta device (trusted code) is counted built."""
    dataset, model, _ = sources
    if isinstance(model, nn.Module):
        return checkpoint_limit(4 * tensor_count(model), cfg.num_clients)
    if model is None:
        if dataset is None:
            folder = cfg.data_dir or None
            dataset = load_dataset(cfg.dataset, folder, cfg.dataset_options, cfg.num_clients)
        shape, classes, options = dataset.input_shape, dataset.num_classes, model_kwargs(cfg)
        model = functools.partial(build_model, cfg.model, shape, classes, cfg.seed, **options)
    values = _count(model, own=sources[1] is not None or is_import_path(cfg.model))
    return checkpoint_limit(4 * values, cfg.num_clients)


def _count(build: Callable[[], nn.Module], own: bool) -> int:
    """The values the model ``build()`` makes holds, built on the meta device; built for
    real where it is the user's own and cannot be built there."""
    try:
        return count_params(build)
    except Exception:
        if not own:
            raise
    with torch.random.fork_rng(devices=[]):
        return tensor_count(build())


def _note_missing_checkpoint(rd: RunDir, found: _Found) -> None:
    """A finished run without checkpoint.pt, or with an earlier round's (every run writes one
    at its last round): damage, rebuilt as a damaged one is (noted after the summary's check
    against its folder, which other damage skips)."""
    if not found.report.finished or found.ck_bad:
        return
    lost = "the run's final weights, kept nowhere else; summary.json holds only their SHA-256"
    if not rd.checkpoint_path.exists():
        found.report.damaged.append(f"checkpoint.pt (missing: {lost})")
        found.ck_bad = True
    elif found.ck is not None and found.ck["round"] != found.target:
        last = f"of round {found.ck['round']}, not the run's last, {found.target}"
        found.report.damaged.append(f"checkpoint.pt ({last}: {lost})")
        found.ck_bad = True


def _summary_damaged(rd: RunDir, report: RepairReport) -> bool:
    """Whether summary.json is damaged (as noted in the report); a run that did not complete
    is refused: there is nothing to rebuild."""
    if not rd.summary_path.exists():
        return False
    try:
        summary = rd.read_summary()
    except ResultsError as e:
        report.damaged.append(_what(e))
        return True
    if summary.get("status") not in (None, "completed"):
        raise ResultsError(
            f"{str(rd.path)!r} holds a run that {summary.get('status')}: nothing to "
            "rebuild; run its config again"
        )
    if report.damaged:
        return False
    return _summary_disagrees(rd, report)


def _summary_disagrees(rd: RunDir, report: RepairReport) -> bool:
    """With nothing else damaged, the summary checked against metrics.jsonl (a cut file: the
    metrics are damaged) and against its folder (a summary copied from another run, checksum
    and all: the summary is)."""
    try:
        run = rd.read_run()
    except ResultsError as e:
        report.damaged.append(_what(e))
        return False
    what = folder_disagreement(run)
    if what is None:
        return False
    report.damaged.append(f"summary.json (disagrees with its folder: {what})")
    return True


def _what(error: ResultsError | CheckpointError) -> str:
    """An error's first clause: what is damaged, without the way out."""
    return f"{error}".split("; ")[0]


def _finished(rd: RunDir, cfg: BaseConfig, ck: dict[str, Any] | None) -> bool:
    """Whether the run finished: it wrote its summary, or its checkpoint is of the last round."""
    return rd.summary_path.exists() or (ck is not None and ck["round"] == cfg.rounds)


def _target_round(cfg: BaseConfig, found: _Found) -> int:
    """The round to rebuild: the last of a finished run, else the checkpoint's, else the newest
    round a checkpoint would have been written at."""
    if found.report.finished:
        return cfg.rounds
    if found.ck is not None:
        return int(found.ck["round"])
    every = cfg.checkpoint_every
    return min(cfg.rounds, len(found.lines) // every * every)


def _dropped(found: _Found) -> str:
    """The report's line for the metrics lines cut after the round rebuilt."""
    return (
        f"metrics.jsonl's {found.late + int(found.torn_after)} line(s) after round {found.target}"
    )


def _drop_late_lines(rd: RunDir, found: _Found) -> RepairReport:
    """Only lines after the checkpoint are damaged: they are cut (``--resume`` does those
    rounds again), the file as it was kept aside; no round is run again."""
    report = found.report
    shutil.copy2(rd.metrics_path, _kept(report))
    rd.truncate_metrics(found.target)
    report.cut = True
    report.dropped.append(_dropped(found))
    return report


def _rerun(
    rd: RunDir,
    cfg: BaseConfig,
    sources: tuple[Any, Any, Any],
    target: int,
    on_round: Callable[[dict[str, Any]], None] | None,
) -> tuple[list[dict[str, Any]], RunDir]:
    """Rounds 1 to ``target`` run again in a scratch folder beside the run: (their records,
    the scratch folder)."""
    scratch = rd.path / SCRATCH
    shutil.rmtree(scratch, ignore_errors=True)
    dataset, model, task = sources
    again = run_experiment(
        cfg, scratch, dataset=dataset, model=model, task=task, stop_after=target, on_round=on_round
    )
    return again.records, RunDir(scratch)


def _check_rerun(rd: RunDir, found: _Found, records: list[dict[str, Any]], fresh: RunDir) -> None:
    """Refuse a rerun that is not this run (an undamaged round, or the whole checkpoint of the
    round rebuilt, not reproduced); the report says what it was checked against."""
    old = found.lines[: found.target]
    for n, ((before, _), new) in enumerate(zip(old, records, strict=False), 1):
        if before is not None:
            _check_round(rd, n, before, new)
    ck = found.ck
    rebuilt = ck if ck is not None and ck["round"] == found.target else None  # its checkpoint
    if rebuilt is not None and not torch.equal(
        rebuilt["weights"], fresh.load_checkpoint()["weights"]
    ):
        raise ResultsError(
            f"running {str(rd.config_path)!r} again does not reproduce checkpoint.pt's "
            "weights: the run was made with other versions or on another machine; nothing "
            "changed"
        )
    _check_final_weights(rd, found, fresh)
    compared = [n for n, (before, _) in enumerate(old, 1) if before is not None]
    found.report.checked = _CHECKED[bool(compared), rebuilt is not None]


def _check_final_weights(rd: RunDir, found: _Found, fresh: RunDir) -> None:
    """Refuse a finished run's rerun whose final weights are not those its whole summary names
    (``weights_sha256``): a checkpoint rebuilt beside a summary of other weights."""
    if not (found.report.finished and rd.summary_path.exists()) or found.summary_bad:
        return
    if not fresh.summary_path.exists():
        return
    want = rd.read_summary().get("weights_sha256")
    got = fresh.read_summary().get("weights_sha256")
    if want and got and want != got:
        raise ResultsError(
            f"running {str(rd.config_path)!r} again does not reproduce the final weights "
            f"summary.json names (weights_sha256 {str(want)[:12]}..., the rerun's {got[:12]}...): "
            "the run was made with other versions or on another machine, or its summary is "
            "another run's; nothing changed"
        )


def _check_round(rd: RunDir, n: int, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Refuse a rerun whose round ``n`` differs from the run's (but for its timings)."""
    a = {k: v for k, v in old.items() if k not in TIMING}
    b = {k: v for k, v in new.items() if k not in TIMING}
    if a != b:
        key = next((k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)), "?")
        raise ResultsError(
            f"running {str(rd.config_path)!r} again does not reproduce round {n} ({key}: "
            f"{a.get(key)!r} vs {b.get(key)!r}): the run was made with other versions or on "
            "another machine (summary.json's environment says which); nothing changed"
        )


def _replace_metrics(rd: RunDir, found: _Found, records: list[dict[str, Any]]) -> None:
    """metrics.jsonl rewritten from its whole lines and the rerun's records for the others
    (the file as it was kept aside), when a line is damaged, late or torn."""
    report = found.report
    merged = [
        old if old is not None else new
        for (old, _), new in zip(found.lines[: found.target], records, strict=False)
    ]
    if found.early or found.late or found.torn:  # else its lines are whole and kept as they are
        if not found.missing:
            shutil.copy2(rd.metrics_path, _kept(report) / rd.metrics_path.name)
        rd.write_metrics(merged)
        report.rebuilt.append("metrics.jsonl")
    if found.late or found.torn_after:
        report.dropped.append(_dropped(found))


def _replace_checkpoint(rd: RunDir, found: _Found, fresh: RunDir) -> None:
    """The rerun's checkpoint (and the client-state store it belongs to) in place of a damaged
    or missing one, the replaced files kept aside."""
    if not (found.ck_bad or found.ck is None):
        return
    report = found.report
    if rd.checkpoint_path.exists():
        rd.checkpoint_path.replace(_kept(report) / rd.checkpoint_path.name)
    fresh.checkpoint_path.replace(rd.checkpoint_path)
    store, rebuilt_store = rd.path / "client_states", fresh.path / "client_states"
    if rebuilt_store.is_dir():
        if store.exists():
            store.replace(_kept(report) / "client_states")
        rebuilt_store.replace(store)
    report.rebuilt.append("checkpoint.pt")


def _replace_summary(rd: RunDir, found: _Found, fresh: RunDir) -> None:
    """The rerun's summary.json (saying what was repaired) and plot in place of a damaged or
    missing summary of a finished run, the replaced one kept aside."""
    report = found.report
    if not (report.finished and (found.summary_bad or not rd.summary_path.exists())):
        return
    if rd.summary_path.exists():
        rd.summary_path.replace(_kept(report) / rd.summary_path.name)
    summary = fresh.read_summary()
    summary["repaired"] = {"damaged": list(report.damaged), "rounds_rerun": found.target}
    rd.write_json("summary.json", summary)
    if (fresh.path / "accuracy.png").exists():
        (fresh.path / "accuracy.png").replace(rd.path / "accuracy.png")
    report.rebuilt.append("summary.json")


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


def _nothing_to_rebuild_to(rd: RunDir, found: _Found) -> ResultsError:
    """The error for damage in an unfinished run before its first whole checkpoint: no round
    to rebuild to, and ``--resume`` runs it again from round 1 (once a damaged checkpoint is
    out of its way: ``--resume`` refuses one)."""
    away = "move its damaged checkpoint.pt away, then " if rd.checkpoint_path.exists() else ""
    return ResultsError(
        f"{str(rd.path)!r}: no whole round before its first checkpoint to rebuild (damaged: "
        f"{', '.join(found.report.damaged)}); {away}run it again with --resume (it starts "
        "from round 1)"
    )


def _kept(report: RepairReport) -> Path:
    """The folder that keeps the files repair replaces."""
    if report.kept_in is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        report.kept_in = report.run_dir / f"damaged-{stamp}"
        report.kept_in.mkdir(exist_ok=True)
    return report.kept_in
