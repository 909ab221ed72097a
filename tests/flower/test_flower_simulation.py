"""configs/flower-smoke.yaml gives identical records and final weights in-process and on
Flower's simulation runtime (a SuperLink fedbug starts and its pool of virtual SuperNodes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flowergrid import only_run, processes_with_env, run_records  # noqa: E402

from fedbug.cli import main  # noqa: E402

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "flower-smoke.yaml"


@pytest.mark.slow
def test_smoke_config_equals_in_process_on_flower_simulation(tmp_path, capsys):
    assert main(["run", str(SMOKE), "--out", str(tmp_path / "here"), "--quiet"]) == 0
    flags = ["-s", "executor=flower-simulation"]
    assert main(["run", str(SMOKE), *flags, "--out", str(tmp_path / "there"), "--quiet"]) == 0
    here, there = only_run(tmp_path / "here"), only_run(tmp_path / "there")
    assert here.name == there.name  # where clients run is not part of the config hash
    assert run_records(there) == run_records(here)
    a = json.loads((here / "summary.json").read_text())
    b = json.loads((there / "summary.json").read_text())
    assert a["weights_sha256"] == b["weights_sha256"]
    uploads = [r["bytes_up"] for r in run_records(there)]
    assert all(0 < u < 4 * a["num_params"] * 4 for u in uploads)  # partial: the head only
    assert processes_with_env("FLWR_HOME", str(there / ".flower")) == []
