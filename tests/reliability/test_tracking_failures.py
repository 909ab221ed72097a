"""Trackers that cannot be written fail in one line (issue 28): an unreachable MLflow server
within a bounded time, a bad ``tracking_uri``, a damaged ``tracking.json``, an ``mlruns/`` that
is missing or cannot be written, a TensorBoard folder that cannot be made; ``tracking.json`` is
written atomically. The parts that need no tracker package are tested without one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny import TINY_DOC, tiny_config

from fedbug.cli import main
from fedbug.errors import FedbugError

TESTS = Path(__file__).resolve().parents[1]


def one_line(e: BaseException, *words: str) -> str:
    msg = str(e)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def needs_mlflow():
    pytest.importorskip("mlflow")


# -- tracking.json, without any tracker package --------------------------------------------------


def test_tracking_json_round_trips_and_is_written_atomically(tmp_path, monkeypatch):
    from fedbug.integrations import tracking
    from fedbug.results import files

    tracking.save_state(tmp_path, {"mlflow_run_id": "abc", "uri": "file:///x"})
    assert tracking.load_state(tmp_path) == {"mlflow_run_id": "abc", "uri": "file:///x"}
    before = (tmp_path / "tracking.json").read_bytes()

    def crash(*a):  # the process dies between writing the new file and renaming it
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", crash)
    with pytest.raises(FedbugError) as e:
        tracking.save_state(tmp_path, {"mlflow_run_id": "def"})
    one_line(e.value, "tracking.json", "No space left")
    assert (tmp_path / "tracking.json").read_bytes() == before  # the old one, whole
    assert [p.name for p in tmp_path.iterdir()] == ["tracking.json"]  # no temp file left


def test_a_missing_tracking_json_is_an_empty_state(tmp_path):
    from fedbug.integrations.tracking import load_state

    assert load_state(tmp_path) == {}


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"mlflow_run_id": 5}', "\ufffd\0"])
def test_a_damaged_tracking_json_is_one_line_naming_it_and_the_fix(tmp_path, text):
    from fedbug.integrations.tracking import load_state

    (tmp_path / "tracking.json").write_text(text)
    with pytest.raises(FedbugError) as e:
        load_state(tmp_path)
    one_line(e.value, str(tmp_path / "tracking.json"), "damaged", "delete it")


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("", "empty"),
        ("http://", "no host"),
        ("https://:5000", "no host"),
        ("http://localhost:port", "port"),
        ("http://local host:5000", "space"),
        ("file:///a\nb", "control"),
    ],
)
def test_a_malformed_tracking_uri_is_refused_in_one_line(uri, problem):
    from fedbug.integrations.tracking import check_tracking_uri

    with pytest.raises(FedbugError) as e:
        check_tracking_uri(uri)
    one_line(e.value, "tracking_uri", problem)


@pytest.mark.parametrize(
    "uri", ["file:///tmp/mlruns", "/tmp/mlruns", "http://127.0.0.1:5000", "sqlite:///m.db"]
)
def test_well_formed_tracking_uris_pass(uri):
    from fedbug.integrations.tracking import check_tracking_uri

    check_tracking_uri(uri)


def test_mlflow_timeouts_are_bounded_unless_the_user_set_them(monkeypatch):
    from fedbug.integrations import tracking

    for name in tracking.MLFLOW_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "300")
    tracking.bound_mlflow_requests()
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "300"  # the user's own
    assert int(os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) <= 2
    assert float(os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"]) <= 1
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    tracking.bound_mlflow_requests()
    assert int(os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"]) <= 15


def test_a_failing_tracker_mid_run_is_one_line(tmp_path):
    """A tracker that fails after the run began (the server went away, the disk is full)."""
    from fedbug.integrations.tracking import Trackers

    class Broken:
        def log_batch(self, *a, **k):
            raise ConnectionError("HTTPConnectionPool(host='h', port=5000): Max retries\nexceeded")

        def log_artifact(self, *a, **k):
            raise OSError(28, "No space left on device")

    t = Trackers([], tmp_path, tiny_config(), resume=False)
    t._mlflow, t._ml_run, t.uri = Broken(), "r1", "http://h:5000"
    with pytest.raises(FedbugError) as e:
        t.log({"round": 3, "test_acc": 0.5})
    one_line(e.value, "MLflow at http://h:5000", "cannot be reached", "round 3", "resume=True")
    assert "--resume" in e.value.cli_message and "\n" not in e.value.cli_message
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(FedbugError) as e:
        t.finish({"final": 0.5})
    one_line(e.value, "MLflow", "No space left")


# -- with MLflow ---------------------------------------------------------------------------------

UNREACHABLE = """
import sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from tiny import tiny_config
from fedbug.errors import FedbugError
from fedbug.integrations.tracking import Trackers
cfg = tiny_config(tracking=["mlflow"], tracking_uri={uri!r})
t = time.monotonic()
try:
    Trackers(["mlflow"], Path({run!r}), cfg, False)
except FedbugError as e:
    print(f"{{time.monotonic() - t:.1f}}", e)
"""


def test_an_unreachable_mlflow_server_fails_in_seconds_in_one_line(tmp_path, needs_mlflow):
    uri = f"http://127.0.0.1:{closed_port()}"
    run = tmp_path / "run"
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    code = UNREACHABLE.format(tests=str(TESTS), uri=uri, run=str(run))
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=90, env=env
    )
    took = time.monotonic() - t0
    seconds, _, msg = out.stdout.strip().partition(" ")
    assert msg, out.stderr[-2000:]
    assert float(seconds) < 20, f"{seconds} s before the error (then {took:.0f} s in all)"
    assert "\n" not in msg and uri in msg and "cannot be reached" in msg, msg
    assert not (run / "tracking.json").exists()


def test_an_unknown_uri_scheme_is_one_line(tmp_path, needs_mlflow):
    from fedbug.integrations.tracking import Trackers

    cfg = tiny_config(tracking=["mlflow"], tracking_uri="nosuch://x")
    with pytest.raises(FedbugError) as e:
        Trackers(["mlflow"], tmp_path, cfg, resume=False)
    one_line(e.value, "tracking_uri", "nosuch://x")


def test_mlruns_that_cannot_be_written_is_one_line(tmp_path, needs_mlflow):
    from fedbug.integrations.tracking import Trackers

    run = tmp_path / "out" / "run"
    run.mkdir(parents=True)
    (tmp_path / "out" / "mlruns").write_text("a file where the store's folder goes")
    with pytest.raises(FedbugError) as e:
        Trackers(["mlflow"], run, tiny_config(tracking=["mlflow"]), resume=False)
    one_line(e.value, "MLflow", str(tmp_path / "out" / "mlruns"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_mlruns_is_one_line(tmp_path, needs_mlflow):
    from fedbug.integrations.tracking import Trackers

    run = tmp_path / "out" / "run"
    run.mkdir(parents=True)
    (tmp_path / "out" / "mlruns").mkdir()
    (tmp_path / "out" / "mlruns").chmod(0o555)
    try:
        with pytest.raises(FedbugError) as e:
            Trackers(["mlflow"], run, tiny_config(tracking=["mlflow"]), resume=False)
        one_line(e.value, "MLflow", "mlruns")
    finally:
        (tmp_path / "out" / "mlruns").chmod(0o755)


def test_resume_after_mlruns_was_deleted_is_one_line(tmp_path, needs_mlflow):
    import shutil

    from fedbug.integrations.tracking import Trackers

    run = tmp_path / "out" / "run"
    run.mkdir(parents=True)
    cfg = tiny_config(tracking=["mlflow"])
    Trackers(["mlflow"], run, cfg, resume=False).close()
    run_id = json.loads((run / "tracking.json").read_text())["mlflow_run_id"]
    shutil.rmtree(tmp_path / "out" / "mlruns")
    with pytest.raises(FedbugError) as e:  # at the start, before the resumed rounds
        Trackers(["mlflow"], run, cfg, resume=True)
    one_line(e.value, run_id, str(run / "tracking.json"), "delete")


def test_a_tensorboard_folder_that_cannot_be_made_is_one_line(tmp_path):
    pytest.importorskip("tensorboard")
    from fedbug.integrations.tracking import Trackers

    (tmp_path / "tensorboard").write_text("a file where the event folder goes")
    with pytest.raises(FedbugError) as e:
        Trackers(["tensorboard"], tmp_path, tiny_config(tracking=["tensorboard"]), resume=False)
    one_line(e.value, "TensorBoard", str(tmp_path / "tensorboard"))


def test_fedbug_run_with_a_bad_tracking_uri_is_one_line_exit_2(tmp_path, capsys, needs_mlflow):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY_DOC, "name": "trk", "rounds": 1}))
    out = tmp_path / "out"
    argv = ["run", str(cfg), "--out", str(out), "-q", "--track", "mlflow"]
    rc = main([*argv, "-s", "tracking_uri=nosuch://x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("fedbug: error: "), err
    assert "nosuch://x" in err[0]


def test_a_malformed_tracking_uri_is_refused_when_the_config_is_read():
    """Before any run folder is made (a late refusal left a half-made folder behind)."""
    import fedbug
    from fedbug.errors import ConfigError

    with pytest.raises(ConfigError, match="has no host"):
        fedbug.config(tracking_uri="http://:80")


def test_a_tracker_that_fails_as_a_new_run_starts_leaves_no_half_made_folder(
    tmp_path, needs_mlflow
):
    """The run folder held config.yaml and partition.* after the failure, so the same command
    given again (once the store was fixed) was refused as "already holds a run"."""
    import fedbug

    out = tmp_path / "out"
    out.mkdir()
    (out / "mlruns").write_text("a file where the store's folder goes")
    cfg = tiny_config(tracking=["mlflow"], rounds=1)
    with pytest.raises(FedbugError, match="MLflow"):
        fedbug.run(cfg, out / "run")
    assert not (out / "run").exists()
    (out / "mlruns").unlink()
    assert fedbug.run(cfg, out / "run").summary["status"] == "completed"
