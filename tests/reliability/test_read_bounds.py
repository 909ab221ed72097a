"""What fedbug reads back from a received run or sweep folder is bounded (RELIABILITY.md, "Trust
model"): each file has a size limit that no run reaches (fedbug.results.limits), checked before
a byte is read; a JSON file is refused at its first zero byte (a sparse file's holes read as
zeros), ``metrics.jsonl`` is read a line at a time (at most one round's line, at most one line
a round); and a FIFO or a device anywhere in a run folder is refused when its lock is taken.

Every sparse file here is made with ``truncate``: nothing is written but its few real bytes.
Readers that could allocate run in a forked child under a memory limit (1 GiB above what the
child has) and a time limit, so that the code before the fix fails (a ``MemoryError``, a hang
killed after 20 s) instead of taking the machine's memory or blocking."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import resource
import select
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from guards import at_most
from tiny import tiny_config

import fedbug.engine.rounds as engine
from fedbug.cli import main
from fedbug.engine import run_experiment
from fedbug.errors import CheckpointError, FedbugError, ResultsError
from fedbug.results import RunDir, limits, metrics_line, read_summary

# ---------------------------------------------------------------- guards


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 8 << 30


def _child(fn: Callable[[], Any], out: int) -> None:
    """In the forked child: run ``fn`` with 1 GiB of address space more than the child has,
    its stderr captured; send back what it returned or raised."""
    room = _vm_bytes() + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (room, room))
    sys.stderr = err = io.StringIO()
    try:
        result: tuple[Any, ...] = ("returned", fn())
    except BaseException as e:  # noqa: BLE001 - every outcome goes back to the test
        result = ("raised", type(e).__name__, str(e), isinstance(e, FedbugError))
    data = pickle.dumps((*result, err.getvalue()))
    os.write(out, data)


def in_child(fn: Callable[[], Any], seconds: float = 20) -> tuple[Any, ...]:
    """``fn()`` in a forked child under a memory and a time limit: ``("returned", value,
    stderr)`` or ``("raised", class name, message, whether a FedbugError, stderr)``; a child
    still running after ``seconds`` (a read that blocks) is killed and the test fails."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            _child(fn, w)
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                break
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            data += chunk
        if not data:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the reader blocked (or died) for {seconds} s")
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return pickle.loads(data)


def sparse(path: Path, size: int, head: bytes = b"", tail: bytes = b"") -> Path:
    """``path``: ``head``, a hole up to ``size``, then ``tail`` (no disk taken by the hole)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
        if tail:
            f.seek(size)
            f.write(tail)
    return path


def refused(outcome: tuple[Any, ...], kind: str, *words: str) -> str:
    """The message of a one-line refusal of class ``kind`` holding ``words``."""
    assert outcome[0] == "raised" and outcome[1] == kind, outcome[:3]
    msg = outcome[2]
    assert len(msg.splitlines()) == 1, msg
    for w in words:
        assert w in msg, msg
    return msg


# ---------------------------------------------------------------- the limits themselves


def test_the_limits_agree_with_the_config_and_the_schema():
    from fedbug.config import limits as config_limits
    from fedbug.config.schema import BaseConfig
    from fedbug.results.thinned import MAX_THIN_ROUNDS
    from fedbug.sweeps.sweep import MAX_SWEEP_RUNS

    def most(field: str) -> int:
        return next(m.le for m in BaseConfig.model_fields[field].metadata if hasattr(m, "le"))

    assert limits.MAX_CLIENTS == most("num_clients") == 10_000_000
    assert limits.MAX_ROUNDS == most("rounds") == MAX_THIN_ROUNDS
    assert limits.MAX_CONFIG_CHARS == config_limits.MAX_CONFIG_CHARS
    assert limits.MAX_CONFIG_VALUES == config_limits.MAX_CONFIG_VALUES
    assert limits.MAX_SWEEP_RUNS == MAX_SWEEP_RUNS
    # the derivations' figures, as their comments give them
    assert limits.MAX_SUMMARY_BYTES == 5_388_435_456
    assert limits.MAX_METRICS_LINE_BYTES == 10_240_065_536
    assert limits.checkpoint_limit(4 * 6570, 6) == 2 * (26280 * 25 + 6 * 16384) + (64 << 20)


def test_a_real_run_is_far_inside_its_limits(finished_run):
    """The tiny run's files against their limits: each an order of magnitude inside at least."""
    rd = RunDir(finished_run)
    assert rd.summary_path.stat().st_size * 1000 < limits.MAX_SUMMARY_BYTES
    longest = max(map(len, rd.metrics_path.read_bytes().splitlines()))
    assert longest * 1000 < limits.MAX_METRICS_LINE_BYTES
    cfg = tiny_config(rounds=2, checkpoint_every=1, count_flops=False, threads=1)
    from fedbug.engine import Experiment

    weights = Experiment(cfg).initial_weights()
    ck = rd.checkpoint_path.stat().st_size
    assert ck * 10 < limits.checkpoint_limit(weights.numel() * 4, cfg.num_clients)


# ---------------------------------------------------------------- summary.json


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bounds")
    cfg = tiny_config(rounds=2, checkpoint_every=1, count_flops=False, threads=1)
    run_experiment(cfg, root / "run")
    return root / "run"


@pytest.fixture
def received(finished_run, tmp_path) -> Path:
    """A copy of the finished run, as if received."""
    shutil.copytree(finished_run, tmp_path / "received" / "run")
    return tmp_path / "received" / "run"


def test_a_summary_past_its_limit_is_refused_unread(tmp_path):
    """A 200-byte tarball can hold a summary.json of 5.4 GB (a sparse file): it was read whole
    (a ``MemoryError``, or a machine swapping). Now refused before a byte is read."""
    path = sparse(tmp_path / "summary.json", limits.MAX_SUMMARY_BYTES + 1)
    outcome = in_child(lambda: read_summary(path))
    refused(outcome, "ResultsError", str(path), "5,388,435,457 bytes", "5,388,435,456")


def test_a_sparse_summary_under_its_limit_is_refused_at_its_first_zero_byte(tmp_path):
    """Under the limit (4 GB, but for its first bytes a hole): refused at the first zero byte,
    after one chunk, in the child's 1 GiB of room (read whole, it took 4 GB)."""
    path = sparse(tmp_path / "summary.json", 4_000_000_000, head=b'{"config": ')
    started = time.monotonic()
    outcome = in_child(lambda: read_summary(path))
    refused(outcome, "ResultsError", str(path), "zero byte at offset 11")
    assert time.monotonic() - started < 10


def test_report_skips_a_run_whose_summary_is_past_its_limit(received):
    """``fedbug report`` skips the run with one warning naming the file and the limit."""
    sparse(received / "summary.json", 10**13)
    outcome = in_child(lambda: main(["report", str(received.parent)]))
    assert outcome[:2] == ("returned", 2), outcome
    err = outcome[2].strip().splitlines()
    assert len(err) == 2, err  # the skipped run's warning, then "no finished runs"
    assert str(received / "summary.json") in err[0] and "5,388,435,456" in err[0], err


# ---------------------------------------------------------------- metrics.jsonl


def _curve(run: Path, rounds: int) -> list[bytes]:
    return (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)[:rounds]


def test_a_hole_after_the_last_line_is_a_torn_line_dropped_unread(received):
    """A metrics.jsonl whose first line is whole and whose rest is a 5 GB hole (what a
    received sparse file holds): the hole is the torn end of the file, dropped as a killed
    writer's half line is, without reading it (was: 5 GB read whole)."""
    line = _curve(received, 1)[0]
    sparse(received / "metrics.jsonl", 5_000_000_000, head=line)
    outcome = in_child(lambda: RunDir(received).read_metrics())
    assert outcome[0] == "returned", outcome[:3]
    assert [r["round"] for r in outcome[1]] == [1]


def test_a_line_past_its_limit_is_refused(received):
    """A hole longer than any round's line (10 GB), then a newline: refused, the line named,
    without reading the hole."""
    line = _curve(received, 1)[0]
    size = len(line) + limits.MAX_METRICS_LINE_BYTES + 10
    sparse(received / "metrics.jsonl", size, head=line, tail=b"\n")
    outcome = in_child(lambda: RunDir(received).read_metrics())
    refused(outcome, "ResultsError", "metrics.jsonl' line 2", "10,240,065,536 bytes")


def test_a_hole_inside_the_curve_is_a_damaged_line(received):
    """A 2 GB hole between two whole lines: line 2 is damaged (not JSON), named as any
    damaged line is; the hole is not read."""
    first, second = _curve(received, 2)
    sparse(received / "metrics.jsonl", 2_000_000_000, head=first, tail=b"\n" + second)
    outcome = in_child(lambda: RunDir(received).read_metrics())
    refused(outcome, "ResultsError", "metrics.jsonl' line 2 is damaged (not valid JSON)")


def test_more_lines_than_rounds_are_refused(received, monkeypatch):
    """More lines than a run has rounds (was: every line parsed first). The reader's limit is
    the run's (1,000,000 rounds), lowered here to 1,000: the same refusal, without a test
    reading a million lines (11-30 s)."""
    import fedbug.results.run_dir as run_dir

    assert run_dir.MAX_ROUNDS == limits.MAX_ROUNDS == 1_000_000
    monkeypatch.setattr(run_dir, "MAX_ROUNDS", 1_000)
    (received / "metrics.jsonl").write_bytes(b"\n" * 1_001)
    with pytest.raises(ResultsError) as e:
        RunDir(received).read_metrics()
    assert "more than 1,000 lines" in str(e.value) and len(str(e.value).splitlines()) == 1
    (received / "metrics.jsonl").write_bytes(b"\n" * 1_000)  # at the limit: read, line by line
    with pytest.raises(ResultsError, match="line 1 is damaged"):
        RunDir(received).read_metrics()


def test_report_skips_a_run_whose_curve_is_a_hole(received):
    """``fedbug report``: one warning naming the file, exit 2 (the summary says 2 rounds)."""
    sparse(received / "metrics.jsonl", 10**13, head=_curve(received, 1)[0])
    outcome = in_child(lambda: main(["report", str(received.parent)]))
    assert outcome[:2] == ("returned", 2), outcome
    err = outcome[2].strip().splitlines()
    assert len(err) == 2 and str(received / "metrics.jsonl") in err[0], err


def test_a_thinned_curve_that_is_a_hole_is_refused(received):
    """A thinned curve (read where metrics.jsonl is absent) of a declaration and a 10 TB hole."""
    from fedbug.results import record_crc

    declared = {"of": "metrics.jsonl", "every": 1, "rounds": 2, "sha256": "0" * 64}
    head = json.dumps({"thinned": declared, "crc": record_crc({"thinned": declared})}) + "\n"
    (received / "metrics.jsonl").unlink()
    path = sparse(received / "metrics.thin.jsonl", 10**13, head=head.encode())
    outcome = in_child(lambda: RunDir(received).read_run())
    refused(outcome, "ResultsError", str(path), "line 2", "10,240,065,536 bytes")


# ---------------------------------------------------------------- the other JSON sides


def test_a_sweep_json_past_its_limit_leaves_the_groups_unnamed(received):
    """sweep.json is read to name the report's groups only: past its limit, the report reads
    the runs without it (was: a ``MemoryError`` traceback)."""
    sparse(received.parent / "sweep.json", 10**13)
    outcome = in_child(lambda: main(["report", str(received.parent)]))
    assert outcome[:2] == ("returned", 0) and outcome[2] == "", outcome


def test_a_recorded_updates_json_side_past_its_limit_is_one_line(tmp_path):
    from fedbug.results.updates import read_meta

    path = sparse(tmp_path / "client-0.json", 10**13)
    refused(in_child(lambda: read_meta(path)), "ConfigError", str(path), "268,435,456")
    path = sparse(tmp_path / "client-1.json", 200_000_000, head=b'{"client": 1')
    refused(in_child(lambda: read_meta(path)), "ConfigError", str(path), "zero byte")


@pytest.mark.parametrize("name", ["client-K.pt", "global.pt"])
def test_a_recorded_tensor_file_past_what_its_update_holds_is_one_line(
    recorded_run, tmp_path, name
):
    """``fedbug attack`` on a received run whose recorded tensors are a 1 TB sparse file: was
    read whole (a ``MemoryError`` traceback); now bounded by what the update's JSON side says
    it holds (the model's values, its inputs and labels): one line, exit 2, no attack folder."""
    from fedbug.results.updates import read_meta, tensors_limit

    run = tmp_path / "received-run"
    shutil.copytree(recorded_run, run)
    meta = sorted((run / "updates" / "round-1").glob("client-*.json"))[0]
    k = meta.stem.split("-")[1]
    path = sparse(meta.parent / name.replace("K", k), 10**12)
    limit = tensors_limit(read_meta(meta))
    assert limit == 67_291_808  # 6,570 weights, 2 images of 64 values: a 29 KB file here
    argv = ["attack", str(run), "--client", k, "--method", "dlg", "--iterations", "1"]
    outcome = in_child(lambda: main(argv))
    assert outcome[:2] == ("returned", 2), outcome
    err = outcome[2].strip()
    assert len(err.splitlines()) == 1 and str(path) in err and f"{limit:,}" in err, err
    assert not (run / "attack").exists()


def test_tracking_json_a_fifo_or_past_its_limit_is_one_line(tmp_path):
    """tracking.json (read when a run with MLflow tracking is resumed) as a FIFO blocked
    forever; as a 10 TB sparse file, a ``MemoryError``."""
    from fedbug.integrations.tracking import load_state

    os.mkfifo(tmp_path / "tracking.json")
    refused(in_child(lambda: load_state(tmp_path)), "TrackingError", "not a regular file")
    (tmp_path / "tracking.json").unlink()
    sparse(tmp_path / "tracking.json", 10**13)
    refused(in_child(lambda: load_state(tmp_path)), "TrackingError", "1,048,576")


# ---------------------------------------------------------------- a resumed run's folder


def _store_cfg():
    return tiny_config(
        algorithm="feddyn", rounds=3, checkpoint_every=1, count_flops=False, threads=1
    )


@pytest.fixture(scope="module")
def cut_run(tmp_path_factory) -> Path:
    """A FedDyn run killed after round 2 whose client states are on disk (client_states/)."""
    root = tmp_path_factory.mktemp("store")
    before = engine.STATE_STORE_MIN_BYTES
    engine.STATE_STORE_MIN_BYTES = 0
    try:
        run_experiment(_store_cfg(), root / "run", stop_after=2)
    finally:
        engine.STATE_STORE_MIN_BYTES = before
    assert (root / "run" / "client_states" / "layout.json").is_file()
    return root / "run"


@pytest.fixture
def cut(cut_run, tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(engine, "STATE_STORE_MIN_BYTES", 0)
    shutil.copytree(cut_run, tmp_path / "run")
    return tmp_path / "run"


def _listing(run: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for p in sorted(run.rglob("*")):
        st = p.lstat()
        out[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def _resume(run: Path) -> FedbugError:
    listing = _listing(run)
    with at_most(20), pytest.raises(FedbugError) as e:
        run_experiment(_store_cfg(), run, resume=True)
    assert len(str(e.value).splitlines()) == 1, str(e.value)
    assert _listing(run) == listing  # nothing written, nothing removed
    return e.value


@pytest.mark.parametrize(
    "name", ["client_states/layout.json", "client_states/data.f32", "client_states/stamps.i64",
             "tracking.json", ".flower/state/x.pt"],
)  # fmt: skip
def test_a_fifo_anywhere_in_a_resumed_run_folder_is_refused(cut, name):
    """A FIFO in place of the client-state store's files (read on ``--resume``: layout.json
    blocked forever, data.f32 and stamps.i64 were an ``UnsupportedOperation`` traceback) or
    anywhere else below the folder (what Flower's nodes read back, tracking.json): refused
    when the folder's lock is taken, before anything is read or written."""
    path = cut / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    err = _resume(cut)
    assert str(path) in str(err) and "FIFO" in str(err), str(err)


def test_a_device_in_a_resumed_run_folder_is_refused(cut):
    path = cut / "client_states" / "data.f32"
    path.unlink()
    try:
        os.mknod(path, 0o600 | 0o020000, os.makedev(1, 5))  # a character device: /dev/zero's
    except (PermissionError, OSError):
        pytest.skip("no permission to make a device node here")
    err = _resume(cut)
    assert str(path) in str(err) and "device" in str(err), str(err)


def test_a_layout_past_its_limit_is_refused_on_resume(cut):
    path = sparse(cut / "client_states" / "layout.json", 10**13)
    err = _resume(cut)
    assert (
        isinstance(err, CheckpointError) and str(path) in str(err) and "67,108,864" in str(err)
    ), str(err)


def test_a_layout_of_another_run_is_refused_on_resume(cut):
    """layout.json naming 10^12 clients: the store was made that large (a sparse file) and its
    stamps scanned (a ``MemoryError``); fields of another model: states of the wrong size."""
    path = cut / "client_states" / "layout.json"
    layout = json.loads(path.read_text())
    path.write_text(json.dumps({**layout, "num_clients": 10**12}))
    err = _resume(cut)
    assert isinstance(err, CheckpointError) and "1000000000000 clients" in str(err), str(err)
    path.write_text(json.dumps({**layout, "fields": {"lambda": [10**12]}}))
    err = _resume(cut)
    assert isinstance(err, CheckpointError) and "'lambda'" in str(err), str(err)


def test_a_checkpoint_past_what_the_model_could_hold_is_refused(cut):
    """A 1 TB sparse checkpoint.pt (was read whole: a ``MemoryError``)."""
    path = sparse(cut / "checkpoint.pt", 10**12)
    err = _resume(cut)
    assert isinstance(err, CheckpointError) and str(path) in str(err), str(err)
    assert "1,000,000,000,000 bytes" in str(err), str(err)


def _printed(argv: list[str]) -> tuple[int, list[str]]:
    """``fedbug ARGV``'s exit status and the lines it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue().splitlines()


def test_repair_rebuilds_a_checkpoint_past_what_the_model_could_hold_unread(received, finished_run):
    """``fedbug repair``, which ``--resume``'s refusal of a 1 TB sparse checkpoint.pt points to,
    read it whole (a ``MemoryError`` traceback). Now under the same limit (the digits MLP's
    6,570 float32 weights, 6 clients: 2 * (26,280 * 25 + 6 * 16,384) + 64 MiB = 68,619,472
    bytes): one damage line, the checkpoint rebuilt by the rerun byte for byte the original's,
    the sparse file kept aside unread."""
    path = sparse(received / "checkpoint.pt", 10**12)
    assert limits.checkpoint_limit(4 * 6570, 6) == 68_619_472
    outcome = in_child(lambda: _printed(["repair", str(received), "--quiet"]), seconds=90)
    assert outcome[0] == "returned", outcome[:3]
    code, lines = outcome[1]
    assert code == 0, lines
    assert [line for line in lines if ": damaged: " in line] == [
        f"{received}: damaged: checkpoint.pt (1,000,000,000,000 bytes, more than this run "
        "writes there (at most 68,619,472): not read)"
    ], lines
    assert f"{received}: rebuilt checkpoint.pt by running rounds 1-2 again" in lines[1], lines
    assert path.read_bytes() == (finished_run / "checkpoint.pt").read_bytes()
    (kept,) = received.glob("damaged-*")
    assert (kept / "checkpoint.pt").stat().st_size == 10**12


def test_the_readers_raise_their_own_classes(tmp_path):
    """A checkpoint's refusal is a CheckpointError, a recorded update's a ConfigError, a
    results file's a ResultsError: what each reader raised before for other damage."""
    from fedbug.results.checkpoint import load_checkpoint_file

    path = sparse(tmp_path / "checkpoint.pt", 10**12)
    with pytest.raises(CheckpointError, match="1,000,000,000,000 bytes"):
        load_checkpoint_file(path, limit=10**6)


def test_metrics_lines_written_by_fedbug_read_back(tmp_path):
    """The line reader against the writer: whole lines, a torn last one dropped."""
    rd = RunDir(tmp_path)
    records = [{"round": n, "test_acc": n / 10, "clients": list(range(n))} for n in (1, 2, 3)]
    raw = "".join(metrics_line(r) for r in records)
    (tmp_path / "metrics.jsonl").write_text(raw + raw.splitlines()[0][:9])
    assert rd.read_metrics() == records
    assert rd.metrics_lines() == ([(r, None) for r in records], True)
