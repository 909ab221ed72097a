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
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any

from fedbug.errors import ConfigError

STATE_FILE = "tracking.json"


def check_available(names: list[str]) -> None:
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
    """The trackers of one run, opened on its run folder."""

    def __init__(self, names: list[str], run_dir: Path, cfg: Any, resume: bool) -> None:
        check_available(names)
        self.run_dir = run_dir
        self.params = flat_params(cfg.model_dump(mode="json"))
        self._tb: Any = None
        self._mlflow: Any = None
        self._ml_run: str | None = None
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if "mlflow" in names:
            self._open_mlflow(cfg, resume)

    def _open_mlflow(self, cfg: Any, resume: bool) -> None:
        import mlflow

        uri = cfg.tracking_uri
        if uri is None:  # a local file store: what needs no server or database
            uri = (self.run_dir.parent / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        state_path = self.run_dir / STATE_FILE
        known = json.loads(state_path.read_text()) if state_path.exists() else {}
        if resume and known.get("mlflow_run_id"):
            self._ml_run = str(known["mlflow_run_id"])
        else:
            exp = client.get_experiment_by_name(cfg.name)
            exp_id = exp.experiment_id if exp is not None else client.create_experiment(cfg.name)
            run = client.create_run(exp_id, run_name=self.run_dir.name)
            self._ml_run = run.info.run_id
            items = list(self.params.items())
            for i in range(0, len(items), 100):  # MLflow takes at most 100 a batch
                params = [mlflow.entities.Param(k, v[:6000]) for k, v in items[i : i + 100]]
                client.log_batch(self._ml_run, params=params)
            state_path.write_text(json.dumps({"mlflow_run_id": self._ml_run, "uri": uri}) + "\n")
        self._mlflow = client

    def log(self, record: dict[str, Any]) -> None:
        """One round's record."""
        values = scalars(record)
        step = int(record["round"])
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, step)
        if self._mlflow is not None:
            import mlflow

            metrics = [mlflow.entities.Metric(k, v, 0, step) for k, v in values.items()]
            for i in range(0, len(metrics), 1000):
                self._mlflow.log_batch(self._ml_run, metrics=metrics[i : i + 1000])

    def finish(self, summary: dict[str, Any]) -> None:
        """The run's end: hparams with the final metrics, plots and summary as artifacts."""
        final = {f"final/{k}": v for k, v in scalars(summary).items()}
        images = sorted(self.run_dir.glob("*.png"))
        if self._tb is not None:
            self._tb.add_hparams(self.params, final, run_name=".")
            for png in images:
                self._tb.add_image(png.stem, _read_png(png), dataformats="HWC")
            self._tb.flush()
        if self._mlflow is not None:
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
