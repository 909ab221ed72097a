"""A run's folder: checks of a checkpoint against the run, opening a run (new or resumed)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from torch import Tensor

from fedbug.config import BaseConfig, config_hash, read_config_doc, validate
from fedbug.data import partition_summary
from fedbug.data.partition_plot import plot_partition
from fedbug.engine.experiment import class_labels
from fedbug.errors import (
    CheckpointError,
    ConfigError,
    FedbugError,
    ResultsError,
    RunFolderHoldsRun,
)
from fedbug.models import is_import_path
from fedbug.results import RunDir, plot_run
from fedbug.results.limits import checkpoint_limit

if TYPE_CHECKING:
    from fedbug.engine.experiment import Experiment
    from fedbug.engine.simulation import Simulation
    from fedbug.engine.states import ClientStates, LocalModelMean

_CHECKPOINT_KEYS = ("round", "weights", "server_state", "client_states", "simulation")
#: how the warning of a ``--resume`` that finds no run in its folder begins (a sweep's cell
#: killed before it wrote its config starts again without it, as a cell not yet begun does)
NOTHING_TO_RESUME = "nothing to resume in"


def check_checkpoint_fits(
    ck: dict[str, Any],
    path: Path,
    cfg: BaseConfig,
    weights: Tensor,
    server_state: dict[str, Any],
    states: ClientStates,
) -> None:
    """Refuse, with one :class:`CheckpointError` naming ``path``, a checkpoint whose contents do
    not fit this run's model (weights of another size, say: written by another model or fedbug
    version under the same config hash), before any of it is loaded."""
    fix = "start the run again in another run folder (or remove this one)"
    missing = [k for k in _CHECKPOINT_KEYS if k not in ck]
    if missing:
        raise CheckpointError(
            f"checkpoint {str(path)!r} lacks {', '.join(missing)}; it was not written by this "
            f"fedbug version; {fix}"
        )
    got = ck["weights"]
    if not isinstance(got, Tensor) or got.shape != weights.shape or got.dtype != weights.dtype:
        what = (
            f"{got.numel():,} {str(got.dtype).removeprefix('torch.')} weights"
            if isinstance(got, Tensor)
            else f"weights of type {type(got).__name__}"
        )
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds {what} where model {cfg.model!r} has "
            f"{weights.numel():,} {str(weights.dtype).removeprefix('torch.')}; it was written by "
            f"another model; {fix}"
        )
    r = ck["round"]
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= cfg.rounds:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is at round {r!r}, outside 0..{cfg.rounds}; {fix}"
        )
    fresh_client = states.algorithm.init_client_state(states.space)
    parts = [(ck["server_state"], server_state, "server state")]
    if not isinstance(ck["client_states"], dict):
        raise CheckpointError(f"checkpoint {str(path)!r} has malformed client states; {fix}")
    parts += [
        (s, fresh_client, f"client {k} state")
        for k, s in ck["client_states"].items()
        if k != "__store__"
    ]
    for saved, fresh, what in parts:
        if not isinstance(saved, dict) or not set(fresh) <= set(saved):
            raise CheckpointError(
                f"checkpoint {str(path)!r}: its {what} does not fit algorithm "
                f"{cfg.algorithm!r}; {fix}"
            )
        for key, t in fresh.items():
            s = saved[key]
            if isinstance(t, Tensor) and (not isinstance(s, Tensor) or s.shape != t.shape):
                raise CheckpointError(
                    f"checkpoint {str(path)!r}: its {what} {key!r} does not fit model "
                    f"{cfg.model!r}; {fix}"
                )


def open_run(
    rd: RunDir,
    exp: Experiment,
    resume: bool,
    chash: str,
    weights: Tensor,
    server_state: dict[str, Any],
    states: ClientStates,
    local_mean: LocalModelMean | None,
    sim: Simulation,
) -> tuple[Tensor, dict[str, Any], int, list[dict[str, Any]]]:
    """Open the run folder: resume from its checkpoint (the loop's weights, server state, first
    round and the records kept; client states, local models and the simulation loaded in place),
    refuse a folder that holds another run, or start it (config, partition, its plot)."""
    cfg = exp.cfg
    records: list[dict[str, Any]] = []
    start = 1
    if resume and rd.checkpoint_path.exists():
        ck = rd.load_checkpoint(checkpoint_limit(weights.nbytes, exp.num_clients))
        if not isinstance(ck, dict) or ck.get("config_hash") != chash:
            found = ck.get("config_hash") if isinstance(ck, dict) else None
            raise CheckpointError(
                f"checkpoint {str(rd.checkpoint_path)!r} was written by another config "
                f"({found} vs {chash}); resume with the same config"
            )
        check_checkpoint_fits(ck, rd.checkpoint_path, cfg, weights, server_state, states)
        weights = ck["weights"]
        server_state = ck["server_state"]
        states.load_state_dict(ck["client_states"])
        if local_mean is not None:
            local_mean.load_state_dict(ck["local_models"])
        sim.load_state_dict(ck["simulation"])
        start = int(ck["round"]) + 1
        records = rd.truncate_metrics(start - 1)
    elif rd.exists_with_results() and not resume:
        raise RunFolderHoldsRun(str(rd.path), finished=_finished(rd, chash))
    elif (rd.path / "summary.json").exists():
        # resume asked of a finished run kept without its checkpoint: never wipe its results
        raise CheckpointError(
            f"run folder {str(rd.path)!r} holds {_ended(rd)} but no checkpoint.pt to resume "
            "from; remove the folder to run it again, or choose another one"
        )
    else:
        # killed before its first checkpoint: round 1 again, as an uninterrupted run did
        if resume and not (rd.path / "config.yaml").exists():
            warnings.warn(
                f"{NOTHING_TO_RESUME} {str(rd.path)!r} (no run was started there): starting a "
                "new run",
                stacklevel=4,
            )
        new_run_folder(rd, exp)
    return weights, server_state, start, records


def new_run_folder(rd: RunDir, exp: Experiment) -> None:
    """A new run's folder: the resolved config, the partition and its plot (one class for a
    data set of values: sizes only)."""
    cfg = exp.cfg
    labels, num_classes = class_labels(exp.dataset)
    rd.create()
    rd.truncate_metrics(0)
    rd.write_config(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    rd.write_json(
        "partition.json",
        {
            "summary": partition_summary(exp.parts, labels, num_classes),
            "clients": [p.tolist() for p in exp.parts],
            **(
                {
                    "test_summary": partition_summary(
                        exp.test_parts, exp.dataset.test_y, exp.dataset.num_classes
                    ),
                    "test_clients": [p.tolist() for p in exp.test_parts],
                }
                if exp.test_parts is not None
                else {}
            ),
        },
    )
    plot_partition(
        exp.parts,
        labels,
        num_classes,
        rd.path / "partition.png",
        f"{cfg.name}: {cfg.partition} partition (seed {cfg.seed})",
        test_parts=exp.test_parts,
        test_labels=exp.dataset.test_y if exp.test_parts is not None else None,
    )


def save_checkpoint(
    rd: RunDir,
    round: int,
    weights: Tensor,
    server_state: dict[str, Any],
    states: ClientStates,
    local_mean: LocalModelMean | None,
    sim: Simulation,
    chash: str,
) -> None:
    """Everything an exact resume after ``round`` needs, written atomically."""
    rd.save_checkpoint(
        {
            "round": round,
            "weights": weights,
            "server_state": server_state,
            "client_states": states.state_dict(),
            "local_models": local_mean.state_dict() if local_mean else {},
            "simulation": sim.state_dict(),
            "config_hash": chash,
        }
    )


def write_summary(
    rd: RunDir, cfg: BaseConfig, summary: dict[str, Any], records: list[dict[str, Any]]
) -> None:
    """The accuracy plot of the records, then summary.json: the summary is the run's last
    file, so a folder that holds one holds the rest (``sweep --resume`` reads such a run back
    instead of running it; a run killed before its summary resumes from its checkpoint)."""
    if records:
        plot_run(records, rd.path / "accuracy.png", f"{cfg.name} (seed {cfg.seed})")
    rd.write_json("summary.json", summary)


def _finished(rd: RunDir, chash: str) -> bool:
    """Whether the run in ``rd`` is this config's (hash ``chash``) and completed, as its
    summary says (never raises)."""
    if not (rd.path / "summary.json").exists():
        return False
    try:
        summary = rd.read_summary()
    except (FedbugError, OSError):
        return False
    return summary.get("config_hash") == chash and summary.get("status") in (None, "completed")


def _ended(rd: RunDir) -> str:
    """How the run in ``rd`` ended, as its summary says (for a message; never raises)."""
    try:
        status = rd.read_summary().get("status")
    except (FedbugError, OSError):
        status = None
    if status in (None, "completed"):
        return "a finished run"
    return f"a run that ended {status!r}"


def folder_disagreement(run: dict[str, Any], source: str = "summary.json") -> str | None:
    """What in a run's summary.json (read and type-checked by
    :meth:`~fedbug.results.RunDir.read_run`; ``source``: the file it was read from, as the
    family benchmark's ``family.json``) disagrees with the rest of its folder, or None:
    its seed with its own config's and config.yaml's, its config hash with config.yaml's (where
    this version can hash that config without importing anything: not a model named by import
    path, nor a config an older version wrote with keys since renamed), and its final figures
    with the last evaluated round of metrics.jsonl. A folder without config.yaml (made by
    hand) is checked against its metrics only."""
    rd = RunDir(run["run_dir"])
    summary, records = run["summary"], run["records"]
    seed = summary["seed"]
    own = summary["config"].get("seed", seed)
    if own != seed:
        return f"seed {seed} in {source} where its own config says seed {own}"
    if rd.config_path.is_file():
        try:
            doc = read_config_doc(rd.config_path)
        except ConfigError as e:
            return f"its config.yaml cannot be read ({e})"
        folder_seed = doc.get("seed", BaseConfig.model_fields["seed"].default)
        if folder_seed != seed:
            return (
                f"seed {seed} in {source} where config.yaml says seed {folder_seed} (a "
                "summary copied from another run?)"
            )
        chash = summary.get("config_hash")
        model, data = str(doc.get("model")), str(doc.get("dataset"))
        if isinstance(chash, str) and not (
            is_import_path(model) or model.startswith("user:") or data.startswith("user:")
        ):
            try:
                folder_hash: str | None = config_hash(validate(doc))
            except ConfigError:  # written by an older version (keys since renamed)
                folder_hash = None
            if folder_hash is not None and folder_hash != chash:
                return (
                    f"config hash {chash} in {source} where config.yaml's is {folder_hash} "
                    "(a summary copied from another run?)"
                )
    return _figures_disagreement(summary, records, source)


#: the way out of a summary that disagrees with its folder, as ``fedbug report`` says it
DISAGREES_FIX = "run the config again, or restore the run's own summary.json from a copy"


def checked_run(rd: RunDir, fix: str = DISAGREES_FIX) -> dict[str, Any]:
    """``rd``'s run read back (:meth:`~fedbug.results.RunDir.read_run`: checksums, schema) and
    checked against its own folder (:func:`folder_disagreement`): what ``fedbug report``, the
    sweep's collect and ``sweep --resume`` read. A summary that disagrees is a
    :class:`~fedbug.errors.ResultsError` naming it, what disagrees and ``fix``."""
    run = rd.read_run()
    what = folder_disagreement(run)
    if what is not None:
        raise ResultsError(f"{str(rd.summary_path)!r} disagrees with its folder: {what}; {fix}")
    return run


def _figures_disagreement(
    summary: dict[str, Any], records: list[dict[str, Any]], source: str = "summary.json"
) -> str | None:
    """Where the summary's final and best figures are not those of ``records`` (as the run
    computed them: the headline metric's last evaluated round, its best over those rounds)."""
    metric = summary.get("metric", "acc")
    key = f"test_{metric}"
    evaluated = [r for r in records if isinstance(r.get(key), int | float)]
    last = evaluated[-1] if evaluated else {}
    where = f"round {last['round']}" if last else "no evaluated round"
    finals = [("final", key), ("final_loss", "test_loss")]
    if metric == "acc":
        finals.append(("final_acc", "test_acc"))
    for name, field in finals:
        if name in summary and not _same(summary[name], last.get(field)):
            return (
                f"{name} {summary[name]} in {source} where metrics.jsonl's last evaluated "
                f"round ({where}) has {field} {last.get(field)}"
            )
    values = [r[key] for r in evaluated]
    bests = {max(values, default=None), min(values, default=None)}
    for name in ("best", "best_acc") if metric == "acc" else ("best",):
        best = summary.get(name)
        if name in summary and not any(_same(best, b) for b in bests):
            return f"{name} {best} in {source}, which no evaluated round of metrics.jsonl has"
    return None


def _same(a: Any, b: Any) -> bool:
    """Equal figures (numbers to 1e-9, NaN equal to NaN)."""
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (a != a and b != b)
    return bool(a == b)
