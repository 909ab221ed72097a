"""Results integrity, the read side: every metrics line and summary.json carry a checksum, so a
damaged run folder is refused with one line naming the file and the line, never read as a
shorter (or silently different) history; ``fedbug report`` and the sweep's collect skip such a
run with one warning line and say so under their table.

``FEDBUG_FUZZ_EXAMPLES=N`` runs N random damage examples instead of the fixed 300
(``derandomize``) of the default suite."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tiny import tiny_config

import fedbug
from fedbug.cli import finished_run, main
from fedbug.errors import ResultsError
from fedbug.results import CRC_KEY, RunDir, read_summary, record_crc
from fedbug.sweeps.sweep import collect_runs

ROUNDS = 4
EXAMPLES = int(os.environ.get("FEDBUG_FUZZ_EXAMPLES", "0"))
TALLY = {"equal": 0, "refused": 0, "torn last line": 0, "prefix": 0}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, object, list[dict], dict]:
    """One small finished run: (folder, config, its records, its summary)."""
    root = tmp_path_factory.mktemp("finished")
    cfg = tiny_config(rounds=ROUNDS, count_flops=False)
    res = fedbug.run(cfg, run_dir=root / "run")
    return root / "run", cfg, res.records, res.summary


def copy_run(src: Path, dst: Path) -> RunDir:
    dst.mkdir(parents=True)
    for name in ("metrics.jsonl", "summary.json"):
        shutil.copyfile(src / name, dst / name)
    return RunDir(dst)


def one_line(e: pytest.ExceptionInfo, path: Path) -> str:
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and str(path) in msg, msg
    return msg


# -- what is written ------------------------------------------------------------------------


def test_every_metrics_line_and_the_summary_carry_a_checksum(finished):
    run_dir, _, records, summary = finished
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == ROUNDS
    for line, record in zip(lines, records):
        written = json.loads(line)
        crc = written.pop(CRC_KEY)
        assert crc == record_crc(written) and len(crc) == 8
        assert written == json.loads(json.dumps(record))  # the record as it was, crc aside
    saved = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert saved.pop(CRC_KEY) == record_crc(saved)
    rd = RunDir(run_dir)
    assert rd.read_metrics() == json.loads(json.dumps(records))  # read back without the crc
    assert rd.read_summary() == json.loads(json.dumps(summary))


def test_files_of_older_versions_without_checksums_still_read(finished, tmp_path):
    run_dir, _, records, summary = finished
    rd = copy_run(run_dir, tmp_path / "old")
    lines = rd.metrics_path.read_text(encoding="utf-8").splitlines()
    old = [{k: v for k, v in json.loads(x).items() if k != CRC_KEY} for x in lines]
    rd.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in old), encoding="utf-8")
    saved = json.loads(rd.summary_path.read_text(encoding="utf-8"))
    saved.pop(CRC_KEY)
    rd.summary_path.write_text(json.dumps(saved, indent=1), encoding="utf-8")
    run = rd.read_run()
    assert run["records"] == json.loads(json.dumps(records))
    assert run["summary"] == json.loads(json.dumps(summary))


# -- damage named precisely -----------------------------------------------------------------


def _bad_json(lines: list[bytes]) -> None:
    lines[1] = lines[1][:10] + b"}" + lines[1][11:]


def _bad_utf8(lines: list[bytes]) -> None:
    lines[1] = lines[1][:12] + b"\xff" + lines[1][13:]


def _changed_value(lines: list[bytes]) -> None:
    record = json.loads(lines[1])
    record["test_acc"] = 0.99 if record["test_acc"] != 0.99 else 0.98
    lines[1] = json.dumps(record, separators=(",", ":")).encode()


def _swapped(lines: list[bytes]) -> None:
    lines[1], lines[2] = lines[2], lines[1]


def _no_checksum(lines: list[bytes]) -> None:
    record = json.loads(lines[1])
    record.pop(CRC_KEY)
    lines[1] = json.dumps(record, separators=(",", ":")).encode()


def _blank(lines: list[bytes]) -> None:
    lines[1] = b""


DAMAGE = {
    "bad JSON": (_bad_json, "not valid JSON"),
    "invalid UTF-8": (_bad_utf8, "not valid UTF-8"),
    "a value changed": (_changed_value, "checksum mismatch"),
    "rounds swapped": (_swapped, "round 3 where round 2 belongs"),
    "checksum removed": (_no_checksum, "no checksum where the other lines have one"),
    "empty line": (_blank, "not valid JSON"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_line_is_named_not_dropped(finished, tmp_path, case):
    """Before, reading stopped at the first bad line and returned the rounds before it (the
    history cut short in silence), or raised UnicodeDecodeError."""
    change, problem = DAMAGE[case]
    rd = copy_run(finished[0], tmp_path / "run")
    lines = rd.metrics_path.read_bytes().split(b"\n")[:-1]
    change(lines)
    rd.metrics_path.write_bytes(b"".join(x + b"\n" for x in lines))
    with pytest.raises(ResultsError) as e:
        rd.read_metrics()
    msg = one_line(e, rd.metrics_path)
    assert "line 2 " in msg and problem in msg and "fedbug repair" in msg, msg


def test_a_torn_last_line_is_dropped_but_a_finished_run_is_refused(finished, tmp_path):
    run_dir, _, records, _ = finished
    rd = copy_run(run_dir, tmp_path / "run")
    raw = rd.metrics_path.read_bytes()
    rd.metrics_path.write_bytes(raw[: len(raw) - 20])  # a killed writer's half line
    assert rd.read_metrics() == json.loads(json.dumps(records[:-1]))
    with pytest.raises(ResultsError) as e:
        rd.read_run()  # summary.json says 4 rounds
    assert "3 whole rounds and a torn last line where summary.json says 4" in one_line(
        e, rd.metrics_path
    )


def test_last_record_glances_at_the_last_whole_line(finished, tmp_path):
    """A run in progress, for a progress bar: the last whole line's record, a torn one after it
    left out, nothing (no error) where there is no whole or sound line."""
    run_dir, _, records, _ = finished
    rd = copy_run(run_dir, tmp_path / "run")
    raw = rd.metrics_path.read_bytes()
    assert rd.last_record() == json.loads(json.dumps(records[-1]))
    rd.metrics_path.write_bytes(raw[: len(raw) - 20])
    assert rd.last_record() == json.loads(json.dumps(records[-2]))
    for damaged in (raw[:20], b"", raw.replace(b'"round":4', b'"round":5')):
        rd.metrics_path.write_bytes(damaged)
        assert rd.last_record() is None
    rd.metrics_path.unlink()
    assert rd.last_record() is None


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda raw: raw[: len(raw) // 2], "not valid JSON"),
        (lambda raw: raw[:40] + b"\xc3\x28" + raw[42:], "not valid UTF-8"),
        (lambda raw: raw.replace(b'"seed": 0', b'"seed": 7', 1), "checksum mismatch"),
        (lambda raw: b"", "not valid JSON"),
        (lambda raw: b"[1, 2]", "not a run summary"),
    ],
    ids=["truncated", "invalid-utf8", "value-changed", "empty", "not-a-mapping"],
)
def test_a_damaged_summary_is_one_line(finished, tmp_path, damage, problem):
    rd = copy_run(finished[0], tmp_path / "run")
    rd.summary_path.write_bytes(damage(rd.summary_path.read_bytes()))
    with pytest.raises(ResultsError) as e:
        read_summary(rd.summary_path)
    assert problem in one_line(e, rd.summary_path)


def test_files_of_two_kinds_are_refused(finished, tmp_path):
    """A summary without a checksum beside metrics lines with them (or the other way round) is
    damage, not an older version: the checksum's key itself may be what was hit."""
    rd = copy_run(finished[0], tmp_path / "run")
    saved = json.loads(rd.summary_path.read_text(encoding="utf-8"))
    saved["crx"] = saved.pop(CRC_KEY)  # one byte of the key changed
    rd.summary_path.write_text(json.dumps(saved, indent=1), encoding="utf-8")
    rd.read_summary()  # alone it reads as an older version's
    with pytest.raises(ResultsError) as e:
        rd.read_run()
    assert "no checksum where metrics.jsonl has them" in one_line(e, rd.summary_path)


# -- resume: what truncate_metrics keeps ----------------------------------------------------


def test_truncate_keeps_rounds_to_the_checkpoint_and_refuses_damage_before_it(finished, tmp_path):
    run_dir, _, records, _ = finished
    plain = json.loads(json.dumps(records))
    rd = copy_run(run_dir, tmp_path / "after")
    lines = rd.metrics_path.read_bytes().split(b"\n")[:-1]
    lines[3] = b"garbage"  # round 4: after a checkpoint at round 2, redone on resume
    rd.metrics_path.write_bytes(b"".join(x + b"\n" for x in lines))
    assert rd.truncate_metrics(2) == plain[:2]
    assert rd.read_metrics() == plain[:2]  # rewritten, with checksums
    rd = copy_run(run_dir, tmp_path / "before")
    raw = rd.metrics_path.read_bytes()
    rd.metrics_path.write_bytes(raw.replace(b'"round":2', b'"round":5', 1))
    with pytest.raises(ResultsError) as e:
        rd.truncate_metrics(3)
    assert "line 2 " in one_line(e, rd.metrics_path)
    assert rd.metrics_path.read_bytes() == raw.replace(b'"round":2', b'"round":5', 1)  # as was
    rd = copy_run(run_dir, tmp_path / "short")
    lines = rd.metrics_path.read_bytes().split(b"\n")[:2]
    rd.metrics_path.write_bytes(b"".join(x + b"\n" for x in lines))
    with pytest.raises(ResultsError) as e:
        rd.truncate_metrics(3)
    assert "2 whole rounds where the checkpoint is at round 3" in one_line(e, rd.metrics_path)
    assert rd.truncate_metrics(0) == [] and rd.metrics_path.read_bytes() == b""


# -- random damage ---------------------------------------------------------------------------

damage = st.one_of(
    st.tuples(
        st.just("flip"),
        st.sampled_from(["metrics.jsonl", "summary.json"]),
        st.lists(
            st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
            min_size=1,
            max_size=3,
        ),
    ),
    st.tuples(
        st.just("truncate"),
        st.sampled_from(["metrics.jsonl", "summary.json"]),
        st.floats(0, 1, exclude_max=True),
    ),
)


@settings(
    max_examples=EXAMPLES or 300,
    derandomize=not EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(damage)
@example(("flip", "metrics.jsonl", [(0.99999999, 32)]))  # the last newline: a torn last line
def test_random_damage_never_gives_a_shorter_or_different_history(finished, tmp_path, damage):
    """Byte changes (1-3 bytes, each to a random value) or a truncation anywhere in
    metrics.jsonl or summary.json of a finished run: reading the run back gives exactly the
    original records and summary, or one ResultsError line naming the damaged file. Reading the
    metrics alone (as a resume does) may also lose the rounds after a cut, and a change of the
    last newline loses exactly the last round (a torn last line), nothing else."""
    run_dir, _, records, summary = finished
    want = json.loads(json.dumps(records))
    want_summary = json.loads(json.dumps(summary))
    kind, name, how = damage
    folder = Path(tmp_path) / f"d{time.perf_counter_ns()}"
    rd = copy_run(run_dir, folder)
    path = folder / name
    raw = bytearray(path.read_bytes())
    if kind == "flip":
        for where, value in how:
            at = int(where * len(raw))
            raw[at] = value if value != raw[at] else (value + 1) % 256
        data = bytes(raw)
    else:
        data = bytes(raw[: int(how * len(raw))])
    path.write_bytes(data)
    try:
        run = rd.read_run()
    except ResultsError as e:
        msg = str(e)
        assert len(msg.splitlines()) == 1 and str(folder) in msg, msg
        TALLY["refused"] += 1
    else:
        assert run["records"] == want, damage
        assert run["summary"] == want_summary, damage
        TALLY["equal"] += 1
    if name != "metrics.jsonl":
        return
    try:
        got = rd.read_metrics()
    except ResultsError as e:
        assert len(str(e).splitlines()) == 1 and str(rd.metrics_path) in str(e)
        return
    whole = data.count(b"\n") if kind == "truncate" else None
    if got == want:
        return
    if kind == "flip":  # only the last newline changed: the last line reads as torn
        assert got == want[:-1] and not data.endswith(b"\n"), damage
        TALLY["torn last line"] += 1
    else:
        assert got == want[:whole], damage
        TALLY["prefix"] += 1


def test_random_damage_tally():
    """Run after the random test: what the examples did (printed with -s)."""
    print(f"\nresults damage drill: {TALLY}")


# -- report and sweep ------------------------------------------------------------------------


def test_report_and_collect_skip_a_damaged_run_with_one_warning(finished, tmp_path, capsys):
    run_dir = finished[0]
    good = copy_run(run_dir, tmp_path / "runs" / "good")
    bad = copy_run(run_dir, tmp_path / "runs" / "bad")
    lines = bad.metrics_path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"round":2', b'"round":2,"x":1', 1)
    bad.metrics_path.write_bytes(b"\n".join(lines))
    # the same config and seed in both: take the good one's config hash (never pooled, as a
    # hand-made summary) so both would count (another seed would disagree with its config.yaml)
    saved = json.loads(good.summary_path.read_text(encoding="utf-8"))
    saved.pop(CRC_KEY)
    saved.pop("config_hash")
    good.summary_path.write_text(json.dumps(saved), encoding="utf-8")
    lines = good.metrics_path.read_text(encoding="utf-8").splitlines()
    old = [{k: v for k, v in json.loads(x).items() if k != CRC_KEY} for x in lines]
    good.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in old), encoding="utf-8")
    runs = collect_runs([tmp_path / "runs"])
    assert [r["run_dir"] for r in runs] == [good.path]
    assert [p for p, _ in runs.damaged] == [bad.path]
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and str(bad.path) in err and "line 2" in err, err
    assert main(["report", str(tmp_path / "runs")]) == 0
    cap = capsys.readouterr()
    assert f"skipped: 1 damaged run(s): {bad.path}" in cap.out.splitlines()
    assert len(cap.err.splitlines()) == 1 and "Traceback" not in cap.err
    bad.summary_path.write_bytes(b"\xff")
    good.summary_path.write_bytes(b'{"rounds": ')
    assert main(["report", str(tmp_path / "runs")]) == 2  # nothing left to report
    cap = capsys.readouterr()
    assert len(cap.err.splitlines()) == 3, cap.err  # two warnings, then the error
    assert "2 damaged run(s) skipped" in cap.err.splitlines()[-1]


def test_sweep_resume_refuses_a_damaged_finished_run(finished, tmp_path):
    """sweep --resume reads a completed run back instead of running it again: a damaged one is
    refused with one line (it used to be read back cut short at the bad line)."""
    run_dir, cfg, records, _ = finished
    rd = copy_run(run_dir, tmp_path / "run")
    assert finished_run(cfg, rd.path)["records"] == json.loads(json.dumps(records))
    raw = rd.metrics_path.read_bytes()
    rd.metrics_path.write_bytes(raw.replace(b'"round":3', b'"round":3 ', 1).replace(b"}", b"", 1))
    with pytest.raises(ResultsError) as e:
        finished_run(cfg, rd.path)
    assert "line 1 " in one_line(e, rd.metrics_path)
