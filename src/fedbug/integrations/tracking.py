"""Tracker output: every round's record as scalars in TensorBoard and MLflow (``tracking:
[tensorboard, mlflow]``, or ``fedbug run --track tensorboard,mlflow``;
``pip install "fedbug[track]"``).

- TensorBoard: event files in ``<run>/tensorboard/``: each numeric field of a round's record
  at step = round; at the end the config as hparams with the final metrics, and the run's plots
  as images.
- MLflow: to ``tracking_uri`` (default a local file store, ``mlruns/`` beside the run folder,
  so that the runs of one sweep or one ``--out`` share it; MLflow 3 keeps its file store in
  maintenance, so fedbug opts in with ``MLFLOW_ALLOW_FILE_STORE``; give ``sqlite:///PATH`` or a
  server's URL for more), experiment = the config's ``name`` (a sweep's
  runs are one experiment), run name = the run folder's name (cell and seed); the config as
  parameters (flattened, ``algorithm``, ``bottom_up.gu_ratio``), each round's numeric fields as
  metrics at step = round, the plots and ``summary.json`` as artifacts. The MLflow run id is kept
  in ``<run>/tracking.json``, so a resumed run logs into the same MLflow run (the rounds after
  its checkpoint are logged again; MLflow keeps both values of a step).

Only what fedbug wrote is sent: a tracker never changes a run's numbers.

A tracker that cannot be written stops the run with one :class:`TrackingError` line naming it,
where, and the way out (the run folder keeps its checkpoint, so a resume continues): at the
start, a malformed ``tracking_uri``, an MLflow server that cannot be reached, a store that
cannot be written, a damaged ``tracking.json``; later, any failed write. MLflow's HTTP client
would retry an unreachable server for about four minutes (120 s a request, 7 retries with
backoff); fedbug bounds it (:data:`MLFLOW_BOUNDS`, about 3 s against a refused connection, at
most about 35 s against one that does not answer) unless the environment sets its own values.
``tracking.json`` is written atomically.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fedbug.errors import ConfigError, FedbugError, first_line
from fedbug.results import atomic_write_text
from fedbug.results.files import read_regular
from fedbug.results.limits import MAX_TRACKING_BYTES

STATE_FILE = "tracking.json"

#: MLflow's HTTP settings for a run, each unless the environment sets it: 10 s a request, two
#: retries, 1 s backoff factor (MLflow's defaults: 120 s, 7 retries, factor 2)
MLFLOW_BOUNDS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}


class TrackingError(FedbugError):
    """A tracker (MLflow, TensorBoard) or ``tracking.json`` cannot be used: one line naming it,
    where, and the way out."""


def bound_mlflow_requests() -> None:
    """Set :data:`MLFLOW_BOUNDS` in this process where the environment has not (MLflow reads
    them at each request)."""
    for name, value in MLFLOW_BOUNDS.items():
        os.environ.setdefault(name, value)


def check_tracking_uri(uri: str) -> None:
    """Refuse, in one line, a ``tracking_uri`` that no store could use: empty, with a control
    character, or an http(s) URL without a host or with a bad port. Which schemes MLflow takes
    (file, sqlite, a database, databricks, plugins) is MLflow's to say, when the run starts."""
    fix = "give http(s)://HOST:PORT, sqlite:///PATH, file:///FOLDER or a folder"
    if not uri.strip():
        raise TrackingError(f"tracking_uri is empty; {fix}, or leave it out for mlruns/")
    if any(not c.isprintable() for c in uri):
        raise TrackingError(f"tracking_uri {uri!r} holds a control character; {fix}")
    parts = urlsplit(uri)
    if parts.scheme.lower() not in ("http", "https"):
        return
    if " " in parts.netloc:
        raise TrackingError(f"tracking_uri {uri!r} has a space in its host; {fix}")
    if not parts.hostname:
        raise TrackingError(f"tracking_uri {uri!r} has no host; {fix}")
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        raise TrackingError(
            f"tracking_uri {uri!r} has a bad port (a number 0-65535); {fix}"
        ) from None


def load_state(run_dir: Path) -> dict[str, Any]:
    """The run's ``tracking.json`` (``{"mlflow_run_id": ..., "uri": ...}``), ``{}`` when there
    is none; a damaged one is a :class:`TrackingError` naming it."""
    path = Path(run_dir) / STATE_FILE
    fix = "delete it to log the rest of this run into a new MLflow run"
    try:  # a regular file (a FIFO blocked forever) of at most 1 MiB
        raw = read_regular(path, MAX_TRACKING_BYTES, error=TrackingError, json_text=True, fix=fix)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise TrackingError(f"{path} cannot be read ({_reason(e)}); delete it") from None
    try:
        state = json.loads(text)
    except ValueError:
        state = None
    fields_ok = isinstance(state, dict) and all(
        isinstance(state.get(k, ""), str) for k in ("mlflow_run_id", "uri")
    )
    if not fields_ok:
        raise TrackingError(
            f'{path} is damaged (not the {{"mlflow_run_id": ..., "uri": ...}} fedbug writes); '
            "delete it to log the rest of this run into a new MLflow run"
        )
    return dict(state)


def save_state(run_dir: Path, state: dict[str, Any]) -> None:
    """Write the run's ``tracking.json`` whole or not at all."""
    path = Path(run_dir) / STATE_FILE
    try:
        atomic_write_text(path, json.dumps(state) + "\n")
    except OSError as e:
        raise TrackingError(f"{path} cannot be written ({_reason(e)})") from None


def _reason(e: BaseException) -> str:
    """A failure in a few words, on one line: the OS error (``[Errno 111] Connection
    refused``, ``timed out``) where one is inside the message, else its first line."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e)
    found = re.search(r"\[Errno -?\d+\] [^'\")\]]+|Read timed out|timed out", text)
    if found:
        return found.group(0).strip()
    first = first_line(e, drop_period=True)
    return first if len(first) <= 200 else first[:197] + "..."


def _unreachable(e: BaseException) -> bool:
    text = f"{type(e).__name__}: {e}"
    return any(
        w in text
        for w in ("Max retries exceeded", "ConnectionError", "Connection refused", "timed out")
    )


def check_available(names: Sequence[str]) -> None:
    """A ConfigError naming the install line for a tracker whose package is missing."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]  # package = name
    if missing:
        raise ConfigError(
            f'tracking: {", ".join(missing)} needs its package: pip install "fedbug[track]"'
        )


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a round's record (lists and nested fields left out)."""
    out = {}
    for k, v in record.items():
        if k == "round" or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if math.isfinite(v):
            out[k] = float(v)
    return out


def flat_params(doc: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A config document as ``key.sub: value`` strings (MLflow parameters, TensorBoard hparams)."""
    out: dict[str, str] = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_params(v, f"{key}."))
        elif v is not None and k not in ("grid",):
            out[key] = json.dumps(v) if isinstance(v, list) else str(v)
    return out


class Trackers:
    """The trackers of one run, opened on its run folder; every failure is a
    :class:`TrackingError`."""

    def __init__(self, names: list[str], run_dir: Path, cfg: Any, resume: bool) -> None:
        check_available(names)
        self.run_dir = run_dir
        self.params = flat_params(cfg.model_dump(mode="json"))
        self.uri: str | None = None
        self._tb: Any = None
        self._mlflow: Any = None
        self._ml_run: str | None = None
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            with self._tensorboard_errors("cannot write"):
                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if "mlflow" in names:
            self._open_mlflow(cfg, resume)

    @contextlib.contextmanager
    def _tensorboard_errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            raise TrackingError(
                f"TensorBoard {doing} {self.run_dir / 'tensorboard'} ({_reason(e)}); free or "
                "fix that place, or remove tensorboard from tracking"
            ) from None

    @contextlib.contextmanager
    def _mlflow_errors(self, doing: str, fix: str, cli_fix: str | None = None) -> Iterator[None]:
        """Any failure inside (MLflow's own, requests', the OS's: a tracker's boundary) as one
        line: MLflow at URI, what failed, why, and ``fix``."""
        try:
            yield
        except FedbugError:
            raise
        except Exception as e:
            why = f"the server cannot be reached ({_reason(e)})" if _unreachable(e) else _reason(e)
            what = f"MLflow at {self.uri} failed {doing}: {why}"
            err = TrackingError(f"{what}; {fix}")
            if cli_fix is not None:
                err.cli_message = f"{what}; {cli_fix}"
            raise err from None

    def _open_mlflow(self, cfg: Any, resume: bool) -> None:
        import mlflow

        uri = cfg.tracking_uri
        if uri is None:  # a local file store: what needs no server or database
            uri = (self.run_dir.parent / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        check_tracking_uri(uri)
        bound_mlflow_requests()
        self.uri = uri
        fix = "fix tracking_uri (or start its server), or remove mlflow from tracking"
        known = load_state(self.run_dir)
        with self._mlflow_errors("to open", fix):
            client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        if resume and known.get("mlflow_run_id"):
            run_id = str(known["mlflow_run_id"])
            state_path = self.run_dir / STATE_FILE
            with self._mlflow_errors("to find the run", fix):
                try:
                    client.get_run(run_id)
                except Exception as e:  # not found, or its whole store is gone
                    if _unreachable(e):
                        raise
                    raise TrackingError(
                        f"MLflow run {run_id} named in {state_path} cannot be found in {uri} "
                        f"({_reason(e)}); if its store was deleted or moved, delete {state_path} "
                        "to log the rest of this run into a new MLflow run, else fix tracking_uri"
                    ) from None
            self._ml_run = run_id
        else:
            with self._mlflow_errors("to start the run", fix):
                exp = client.get_experiment_by_name(cfg.name)
                exp_id = (
                    exp.experiment_id if exp is not None else client.create_experiment(cfg.name)
                )
                run = client.create_run(exp_id, run_name=self.run_dir.name)
                self._ml_run = run.info.run_id
                items = list(self.params.items())
                for i in range(0, len(items), 100):  # MLflow takes at most 100 a batch
                    params = [mlflow.entities.Param(k, v[:6000]) for k, v in items[i : i + 100]]
                    client.log_batch(self._ml_run, params=params)
            save_state(self.run_dir, {"mlflow_run_id": self._ml_run, "uri": uri})
        self._mlflow = client

    def log(self, record: dict[str, Any]) -> None:
        """One round's record."""
        values = scalars(record)
        step = int(record["round"])
        if self._tb is not None:
            with self._tensorboard_errors(f"failed to write round {step} to"):
                for k, v in values.items():
                    self._tb.add_scalar(k, v, step)
        if self._mlflow is not None:
            import mlflow

            metrics = [mlflow.entities.Metric(k, v, 0, step) for k, v in values.items()]
            with self._mlflow_errors(
                f"to log round {step}",
                "the run stopped after that round with its checkpoint; fix it and resume "
                "(resume=True), or resume without mlflow in tracking",
                "the run stopped after that round with its checkpoint; fix it and continue with "
                "--resume, or resume without mlflow in tracking",
            ):
                for i in range(0, len(metrics), 1000):
                    self._mlflow.log_batch(self._ml_run, metrics=metrics[i : i + 1000])

    def finish(self, summary: dict[str, Any]) -> None:
        """The run's end: hparams with the final metrics, plots and summary as artifacts."""
        final = {f"final/{k}": v for k, v in scalars(summary).items()}
        images = sorted(self.run_dir.glob("*.png"))
        if self._tb is not None:
            with self._tensorboard_errors("failed to write the run's end to"):
                self._tb.add_hparams(self.params, final, run_name=".")
                for png in images:
                    self._tb.add_image(png.stem, _read_png(png), dataformats="HWC")
                self._tb.flush()
        if self._mlflow is not None:
            with self._mlflow_errors(
                "to store the run's end (plots, summary.json)",
                "the run itself is complete in its folder; fix it, or remove mlflow from tracking",
            ):
                for path in [*images, self.run_dir / "summary.json"]:
                    if path.exists():
                        self._mlflow.log_artifact(self._ml_run, str(path))
                self._mlflow.set_terminated(self._ml_run, status="FINISHED")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _read_png(path: Path) -> Any:
    import matplotlib.image

    return matplotlib.image.imread(str(path))[..., :3]
