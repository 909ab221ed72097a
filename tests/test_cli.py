"""The ``fedbug`` command end to end: run folders, overrides, resume, one-line errors, sweeps,
theory and data. Runs are tiny (digits, MLP, 4 clients, 2 rounds, 2 local steps)."""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from tiny import TINY_DOC

from fedbug.cli import main

TINY = TINY_DOC

RUN_FILES = {
    "config.yaml",
    "metrics.jsonl",
    "summary.json",
    "accuracy.png",
    "checkpoint.pt",
    "partition.json",
}


@pytest.fixture
def fast_plots(stub_plot) -> None:
    """Per-run plots are most of a tiny run's time: a PNG signature for accuracy.png where a
    test does not read it (test_run_writes_one_complete_run_folder checks the real one; sweeps
    keep their own)."""

    def stub(records: list, path: Path, title: str) -> None:
        path.write_bytes(b"\x89PNG\r\n\x1a\n")

    stub_plot("plot_run", stub)


def write_config(tmp_path: Path, doc: object = None, name: str = "tiny.yaml", **extra) -> Path:
    """A tiny config written as YAML (``doc`` replaces it entirely when given)."""
    path = tmp_path / name
    if doc is None:
        doc = {**TINY, **extra}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []


def empty_or_absent(out: Path) -> bool:
    return not out.exists() or not any(out.iterdir())


def assert_one_line_error(rc: int, err: str, *words: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fedbug: error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])


# -- run -------------------------------------------------------------------------------------


def test_run_writes_one_complete_run_folder(tmp_path, capsys):
    cfg = write_config(tmp_path, doc={k: v for k, v in TINY.items() if k != "threads"})
    out = tmp_path / "out"
    rc, stdout, err = cli(capsys, "run", str(cfg), "--out", str(out), "-q")
    assert rc == 0, err
    (rd,) = run_dirs(out)
    assert list(out.iterdir()) == [rd]
    # named NAME-sSEED-HASH, NAME from the file name
    assert re.fullmatch(r"tiny-s0-[0-9a-f]{10}", rd.name)
    assert {p.name for p in rd.iterdir()} >= RUN_FILES
    lines = (rd / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["round"] for r in records] == [1, 2]
    assert all(0.0 <= r["test_acc"] <= 1.0 for r in records)
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["rounds"] == 2
    assert summary["final_acc"] == records[-1]["test_acc"]
    saved = yaml.safe_load((rd / "config.yaml").read_text())
    assert saved["rounds"] == 2 and saved["model"] == "mlp"
    assert isinstance(saved["threads"], int) and saved["threads"] >= 1  # resolved, not null
    assert (rd / "accuracy.png").read_bytes().startswith(b"\x89PNG")
    part = json.loads((rd / "partition.json").read_text())
    assert len(part["clients"]) == 4
    assert f"run folder: {rd}" in stdout
    assert "final test accuracy" in stdout


def test_run_overrides_apply_including_dotted(tmp_path, capsys, fast_plots):
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    rc, _, err = cli(
        capsys,
        "run",
        str(cfg),
        "--out",
        str(out),
        "-q",
        "-s",
        "algorithm=fedprox",
        "-s",
        "fedprox.mu=0.5",
        "--set",
        "lr=5e-2",
        "-s",
        "seed=3",
        "-s",
        "name=other",
    )
    assert rc == 0, err
    (rd,) = run_dirs(out)
    assert rd.name.startswith("other-s3-")
    saved = yaml.safe_load((rd / "config.yaml").read_text())
    assert saved["algorithm"] == "fedprox"
    assert saved["fedprox"]["mu"] == 0.5
    assert saved["lr"] == 0.05
    assert saved["seed"] == 3
    assert saved["feddyn"]["alpha"] == 0.01  # other blocks keep their defaults
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["config"]["fedprox"]["mu"] == 0.5


def test_a_warning_under_the_command_is_one_line(tmp_path, capsys, fast_plots):
    """A library warning under ``fedbug`` is ``fedbug: warning: MESSAGE``: no source path, no
    source line; Python's own display is back once the command returns."""
    cfg = write_config(tmp_path)
    before = warnings.showwarning
    degenerate = ("-s", "policy=bottom_up", "-s", "bottom_up.gu_ratio=0")
    rc, _, err = cli(capsys, "run", str(cfg), *degenerate, "--out", str(tmp_path / "o"), "-q")
    assert rc == 0, err
    assert err.splitlines() == [
        "fedbug: warning: bottom_up with gu_ratio 0 unfreezes every unit at the first step: it "
        "is plain training (policy: none)"
    ]
    assert warnings.showwarning is before


def test_a_sweep_shows_each_warning_once(tmp_path, capsys, fast_plots):
    """A warning every run of a sweep gives (here three seeds of one degenerate policy) is one
    line, not one a run: a run's FLOP counter and checkpoint loader reset Python's registry of
    warnings already shown."""
    cfg = write_config(tmp_path)
    degenerate = ("-s", "policy=bottom_up", "-s", "bottom_up.gu_ratio=0", "-s", "seeds=3")
    rc, _, err = cli(capsys, "sweep", str(cfg), *degenerate, "--out", str(tmp_path / "o"), "-q")
    assert rc == 0, err
    assert [line for line in err.splitlines() if "warning" in line] == [
        "fedbug: warning: bottom_up with gu_ratio 0 unfreezes every unit at the first step: it "
        "is plain training (policy: none)"
    ]


def test_rerun_needs_resume_and_resume_of_finished_run_keeps_metrics(tmp_path, capsys, fast_plots):
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    assert cli(capsys, "run", str(cfg), "--out", str(out), "-q")[0] == 0
    (rd,) = run_dirs(out)
    metrics = (rd / "metrics.jsonl").read_bytes()
    summary = json.loads((rd / "summary.json").read_text())

    rc, _, err = cli(capsys, "run", str(cfg), "--out", str(out), "-q")
    assert_one_line_error(rc, err, "--resume")
    assert (rd / "metrics.jsonl").read_bytes() == metrics
    # record_updates is not in the folder's name: the same folder, said to be a finished run
    rc, _, err = cli(capsys, "run", str(cfg), "--out", str(out), "-q", "-s", "record_updates=[1]")
    assert_one_line_error(rc, err, "finished run")
    assert "record_updates" in err and "another --out" in err

    rc, _, err = cli(capsys, "run", str(cfg), "--out", str(out), "-q", "--resume")
    assert rc == 0, err
    assert run_dirs(out) == [rd]
    assert (rd / "metrics.jsonl").read_bytes() == metrics
    again = json.loads((rd / "summary.json").read_text())
    assert again["final_acc"] == summary["final_acc"]
    assert again["status"] == "completed"


def test_run_folder_hash_is_the_summary_config_hash(tmp_path, capsys, fast_plots):
    cfg = write_config(tmp_path, doc={k: v for k, v in TINY.items() if k != "threads"})
    out = tmp_path / "out"
    assert cli(capsys, "run", str(cfg), "--out", str(out), "-q")[0] == 0
    (rd,) = run_dirs(out)
    summary = json.loads((rd / "summary.json").read_text())
    assert rd.name.endswith("-" + summary["config_hash"])


# -- bad input: exit 2, one line, nothing written ----------------------------------------------

BAD_OVERRIDES = [
    pytest.param(["lrr=0.1"], ["unknown key 'lrr'", "'lr'"], id="unknown-key"),
    pytest.param(["fedprox.mux=1"], ["'fedprox.mux'", "'fedprox.mu'"], id="nested-key"),
    pytest.param(["rounds=abc"], ["rounds", "integer", "'abc'"], id="wrong-type"),
    pytest.param(["bottom_up.gu_ratio=1.5"], ["gu_ratio", "1.5"], id="gu-ratio-range"),
    pytest.param(["lr=-1"], ["lr", "greater than 0"], id="negative-lr"),
    pytest.param(["participation=0"], ["participation", "greater than 0"], id="participation-0"),
    pytest.param(
        ["algorithm=fedbugg"],
        ["algorithm", "'fedbugg'", "fedavg", "feddecorr", "feddyn", "fedexp", "fedprox"],
        id="unknown-algorithm",
    ),
    pytest.param(
        ["policy=bottomup"],
        ["policy", "bottom_up", "top_down", "fixed_head", "none"],
        id="unknown-policy",
    ),
    pytest.param(
        ["dataset=no_such_data"],
        ["dataset", "'no_such_data'", "digits", "fashion_mnist"],
        id="dataset",
    ),
    pytest.param(
        ["model=resnet"], ["model", "'resnet'", "mlp", "digits_cnn", "standard_cnn"], id="model"
    ),
    pytest.param(["lr"], ["'lr'", "key=value"], id="no-equals"),
    pytest.param(["=1"], ["key=value"], id="empty-key"),
    pytest.param([".lr=1"], ["'.lr'"], id="empty-dotted-part"),
    pytest.param(["model.x=1"], ["'model'", "not a block"], id="scalar-as-block"),
    pytest.param(["fedprox=3"], ["fedprox"], id="block-as-scalar"),
    pytest.param(["clients_per_round=9"], ["clients_per_round=9", "num_clients=4"], id="cpr"),
    pytest.param(["selection=uniform", "clients_per_round=null"], ["uniform"], id="selection"),
    pytest.param(["partition=zipf"], ["partition", "'zipf'"], id="partition-literal"),
    pytest.param(["units=[nosuch]"], ["'nosuch'", "classifier"], id="unknown-unit"),
    pytest.param(
        ["units=[conv1"],
        ["units: blocks, or a list of unit names", "got '[conv1'"],
        id="units-neither-form",
    ),  # fmt: skip
    pytest.param(["num_clients=5000", "clients_per_round=2"], ["num_clients"], id="too-many"),
    pytest.param(
        ["policy=fixed_top", "fixed_top.fixed_units=9"], ["fixed_units"], id="freezes-all"
    ),
    pytest.param(["algorithm=fedexp", "global_lr=2"], ["global_lr"], id="fedexp-global-lr"),
]


@pytest.mark.parametrize("overrides, words", BAD_OVERRIDES)
def test_bad_override_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, overrides, words):
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    argv = ["run", str(cfg), "--out", str(out), "-q"]
    for o in overrides:
        argv += ["-s", o]
    rc, stdout, err = cli(capsys, *argv)
    assert_one_line_error(rc, err, *words)
    assert stdout == ""
    assert empty_or_absent(out)


BAD_FILES = [
    pytest.param(None, ["not found"], id="missing-file"),
    pytest.param("- lr: 0.1\n- rounds: 2\n", ["mapping"], id="list-not-mapping"),
    pytest.param("just a string\n", ["mapping"], id="scalar-not-mapping"),
    pytest.param("lr: [0.1\nrounds: 2\n", ["not valid YAML"], id="invalid-yaml"),
    pytest.param("a: 1\n  b: 2\n", ["not valid YAML"], id="bad-indent"),
    pytest.param("rounds: 2\nlr: 0.1: 3\n", ["not valid YAML", "(line 2, column 8)"], id="where"),
    pytest.param(
        "rounds: 2\nlr: [0.1, 0.2\nbatch_size: 8\n",
        ["(line 3, column 11)", "flow sequence begun at line 2"],
        id="where-it-began",
    ),
    pytest.param(b"lr: \xff\xfe\n", ["not valid YAML"], id="not-utf8"),
    pytest.param("lrr: 0.1\nmodel: mlp\n", ["'lrr'", "'lr'"], id="unknown-key-in-file"),
    pytest.param("fedprox: {mux: 1}\n", ["'fedprox.mux'", "'fedprox.mu'"], id="nested-in-file"),
    pytest.param("1: 2\n", ["strings"], id="non-string-key"),
]


@pytest.mark.parametrize("content, words", BAD_FILES)
def test_bad_config_file_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, content, words):
    path = tmp_path / "bad.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    for command in ("run", "sweep"):
        rc, stdout, err = cli(capsys, command, str(path), "--out", str(out), "-q")
        assert_one_line_error(rc, err, *words)
        assert empty_or_absent(out)


FORMERLY_CRASHING_INPUT = [
    pytest.param(
        "run",
        ["-s", "lr=!!float abc"],
        "lr",
        id="float-tag-override",
    ),
    pytest.param(
        "run",
        ["-s", "seed=!!timestamp x"],
        "seed",
        id="timestamp-tag-override",
    ),
    pytest.param(
        "sweep",
        ["--seeds", "0"],
        "seeds",
        id="sweep-seeds-0",
    ),
]


@pytest.mark.parametrize("command, extra, word", FORMERLY_CRASHING_INPUT)
def test_formerly_crashing_input_is_one_line(tmp_path, capsys, command, extra, word):
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    rc, _, err = cli(capsys, command, str(cfg), "--out", str(out), "-q", *extra)
    assert_one_line_error(rc, err, word)
    assert empty_or_absent(out)


def test_bad_yaml_tag_in_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "tagged.yaml"
    path.write_text("model: mlp\nrounds: !!int two\n", encoding="utf-8")
    rc, _, err = cli(capsys, "run", str(path), "--out", str(tmp_path / "out"), "-q")
    assert_one_line_error(rc, err, "YAML")


def test_out_that_is_a_file_is_one_line(tmp_path, capsys):
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    out.write_text("not a folder\n")
    rc, _, err = cli(capsys, "run", str(cfg), "--out", str(out), "-q")
    assert_one_line_error(rc, err, str(out))


def test_no_command_or_config_is_a_usage_error(capsys):
    for argv in ([], ["run"], ["frobnicate"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert "usage" in capsys.readouterr().err


# -- the real process: exit code and stderr ---------------------------------------------------


def test_importing_fedbug_main_runs_no_command():
    """``python -m fedbug`` runs the command (below); importing ``fedbug.__main__``, as
    ``hasattr(fedbug, "__main__")`` does through the package's lazy attributes, runs none."""
    import fedbug

    sys.modules.pop("fedbug.__main__", None)
    assert hasattr(fedbug, "__main__") and fedbug.__main__.main is main


def test_subprocess_bad_key_exit_code_and_one_line_stderr(tmp_path):
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "fedbug", "run", str(cfg), "--out", str(out), "-s", "lrr=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert_one_line_error(proc.returncode, proc.stderr, "'lrr'", "'lr'")
    assert empty_or_absent(out)


def test_console_script_missing_config(tmp_path):
    script = Path(sys.executable).with_name("fedbug")
    if not script.exists():
        pytest.skip("the fedbug console script is not installed beside this python")
    proc = subprocess.run(
        [str(script), "run", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(proc.returncode, proc.stderr, "nope.yaml", "not found")
    assert not (tmp_path / "out").exists()


def test_a_run_refused_as_it_starts_leaves_no_folder_behind(tmp_path, capsys):
    """A refusal found while the run is built (tf32 on a CPU), after its folder was made: the
    folders made for it, --out's too, go again."""
    cfg = write_config(tmp_path, precision="tf32")
    out = tmp_path / "a" / "b"
    rc, _, err = cli(capsys, "run", str(cfg), "--out", str(out), "-q")
    assert_one_line_error(rc, err, "tf32")
    assert not (tmp_path / "a").exists()
    (tmp_path / "kept").mkdir()  # a folder that was there stays
    rc, _, err = cli(capsys, "run", str(cfg), "--out", str(tmp_path / "kept"), "-q")
    assert rc == 2 and (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())


# -- sweep -----------------------------------------------------------------------------------


def test_sweep_grid_times_seeds_table_and_files(tmp_path, capsys, fast_plots):
    cfg = write_config(tmp_path, policy="bottom_up", grid={"bottom_up.gu_ratio": [0.0, 0.5]})
    out = tmp_path / "out"
    rc, stdout, err = cli(
        capsys,
        "sweep",
        str(cfg),
        "--out",
        str(out),
        "-q",
        "-g",
        "algorithm=fedavg,fedprox",
        "--seeds",
        "2",
    )
    assert rc == 0, err
    sweep = out / "tiny-sweep"
    assert list(out.iterdir()) == [sweep]
    runs = run_dirs(sweep)
    assert len(runs) == 8  # 2 x 2 cells x 2 seeds
    for rd in runs:
        assert {p.name for p in rd.iterdir()} >= RUN_FILES
    assert {"sweep.md", "sweep.json", "accuracy.png"} <= {p.name for p in sweep.iterdir()}
    assert (sweep / "accuracy.png").read_bytes().startswith(b"\x89PNG")

    rows = [line for line in stdout.splitlines() if line.startswith("| bottom_up.gu_ratio=")]
    assert len(rows) == 4
    assert all("±" in r for r in rows)
    assert "| bottom_up.gu_ratio=0.5, algorithm=fedprox | 2 |" in stdout
    assert "| bottom_up.gu_ratio=0.5, algorithm=fedprox | 2 |" in (sweep / "sweep.md").read_text()

    data = json.loads((sweep / "sweep.json").read_text())
    assert data["name"] == "tiny"
    assert len(data["rows"]) == 4
    cells = {(r["cell"]["bottom_up.gu_ratio"], r["cell"]["algorithm"]) for r in data["rows"]}
    assert cells == {(g, a) for g in (0.0, 0.5) for a in ("fedavg", "fedprox")}
    for row in data["rows"]:
        assert row["seeds"] == [0, 1]
        finals = [
            json.loads((Path(p) / "summary.json").read_text())["final_acc"] for p in row["runs"]
        ]
        assert len(finals) == 2
        assert math.isclose(row["final_acc_mean"], statistics.fmean(finals), abs_tol=1e-12)
        assert math.isclose(row["final_acc_std"], statistics.stdev(finals), abs_tol=1e-12)
        configs = [yaml.safe_load((Path(p) / "config.yaml").read_text()) for p in row["runs"]]
        assert {c["bottom_up"]["gu_ratio"] for c in configs} == {row["cell"]["bottom_up.gu_ratio"]}
        assert {c["algorithm"] for c in configs} == {row["cell"]["algorithm"]}
        assert [c["seed"] for c in configs] == [0, 1]


def test_sweep_g_over_algorithms_takes_the_block_set_with_s(tmp_path, capsys, fast_plots):
    """What the refusal of an unused block tells the user to do: ``-g algorithm=...``."""
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    rc, _, err = cli(
        capsys, "sweep", str(cfg), "--out", str(out), "-q",
        "-g", "algorithm=fedavg,fedprox", "-s", "fedprox.mu=0.1",
    )  # fmt: skip
    assert rc == 0, err
    configs = [
        yaml.safe_load((rd / "config.yaml").read_text()) for rd in run_dirs(out / "tiny-sweep")
    ]
    assert {(c["algorithm"], c["fedprox"]["mu"]) for c in configs} == {
        ("fedavg", 0.1),
        ("fedprox", 0.1),
    }


def test_run_of_a_sweep_config_refuses_a_block_its_grid_never_uses(tmp_path, capsys):
    cfg = write_config(tmp_path, grid={"policy": ["none", "bottom_up"]})
    out = tmp_path / "out"
    rc, _, err = cli(capsys, "run", str(cfg), "--out", str(out), "-q", "-s", "fedprox.mu=0.01")
    assert_one_line_error(rc, err, "fedprox: has no effect under algorithm: fedavg")
    assert empty_or_absent(out)


@pytest.mark.parametrize(
    "grid, words",
    [
        pytest.param(
            "bottom_up.gu_ratio=0,7", ["gu_ratio=7", "less than or equal to 1"], id="range"
        ),
        pytest.param("lrr=0.1,0.2", ["'lrr'", "'lr'"], id="unknown-key"),
        pytest.param("algorithm=fedavg,fedbugg", ["'fedbugg'", "fedprox"], id="unknown-name"),
        pytest.param("gu_ratio", ["key=v1,v2"], id="no-equals"),
        pytest.param("gu_ratio=", ["key=v1,v2"], id="no-values"),
    ],
)
def test_sweep_bad_grid_exits_2_before_any_run(tmp_path, capsys, grid, words):
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    rc, _, err = cli(capsys, "sweep", str(cfg), "--out", str(out), "-q", "-g", grid)
    assert_one_line_error(rc, err, *words)
    assert empty_or_absent(out)


def test_sweep_bad_grid_in_file_exits_2_before_any_run(tmp_path, capsys):
    cfg = write_config(tmp_path, grid={"bottom_up.gu_ratio": [0.0, 1.5]})
    out = tmp_path / "out"
    rc, _, err = cli(capsys, "sweep", str(cfg), "--out", str(out), "-q")
    assert_one_line_error(rc, err, "gu_ratio=1.5")
    assert empty_or_absent(out)


def test_sweep_g_does_not_hide_a_grid_in_the_file_that_is_no_mapping(tmp_path, capsys):
    cfg = write_config(tmp_path, grid="gu_ratio")
    out = tmp_path / "out"
    rc, _, err = cli(capsys, "sweep", str(cfg), "--out", str(out), "-q", "-g", "lr=0.1,0.2")
    assert_one_line_error(rc, err, "grid")
    assert empty_or_absent(out)


def test_sweep_unknown_model_in_grid_fails_before_any_run(tmp_path, capsys, fast_plots):
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    rc, _, err = cli(capsys, "sweep", str(cfg), "--out", str(out), "-q", "-g", "model=mlp,nosuch")
    assert_one_line_error(rc, err, "'nosuch'")
    assert empty_or_absent(out)


def test_sweep_duplicate_grid_values_fail_before_any_run(tmp_path, capsys, fast_plots):
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    rc, _, err = cli(
        capsys, "sweep", str(cfg), "--out", str(out), "-q", "-g", "bottom_up.gu_ratio=0.5,.5"
    )
    assert_one_line_error(rc, err, "gu_ratio")
    assert empty_or_absent(out)


def test_sweep_grid_with_a_yaml_date_is_one_line(tmp_path, capsys):
    path = tmp_path / "dated.yaml"
    path.write_text(yaml.safe_dump(TINY) + "grid: {name: [2024-01-01]}\n", encoding="utf-8")
    out = tmp_path / "out"
    rc, _, err = cli(capsys, "sweep", str(path), "--out", str(out), "-q")
    assert_one_line_error(rc, err, "name")
    assert empty_or_absent(out)


# -- theory and data -------------------------------------------------------------------------


def test_theory_json_matches_theorem_2(capsys):
    rc, stdout, err = cli(capsys, "theory", "--eta", "0.2", "0.6", "--clients", "2", "3", "--json")
    assert rc == 0, err
    report = json.loads(stdout)
    rows = report["two_client"]
    assert [r["eta"] for r in rows] == [0.2, 0.6]
    for r in rows:
        assert abs(r["fedbug_measured"] - (3 - r["eta"]) / 4) < 1e-9
        assert abs(r["fedavg_measured"] - 0.75) < 1e-9
    assert {(r["clients"], r["eta"]) for r in report["m_client"]} == {
        (m, e) for m in (2, 3) for e in (0.2, 0.6)
    }


def test_theory_text_report(capsys):
    rc, stdout, _ = cli(capsys, "theory", "--eta", "0.5", "--clients", "2")
    assert rc == 0
    assert "3/4" in stdout and "(3-eta)/4" in stdout


@pytest.mark.parametrize(
    "argv, word",
    [(["--eta", "1.5"], "eta=1.5"), (["--eta", "0"], "eta=0"), (["--clients", "1"], "clients")],
)
def test_theory_out_of_range_exits_2(capsys, argv, word):
    rc, stdout, err = cli(capsys, "theory", *argv)
    assert_one_line_error(rc, err, word)
    assert stdout == ""


def test_data_json(tmp_path, capsys):
    rc, stdout, err = cli(capsys, "data", "--json", "--data-dir", str(tmp_path))
    assert rc == 0, err
    rows = {r["name"]: r for r in json.loads(stdout)}
    assert rows["digits"]["found"] is True
    assert rows["digits"]["where"]
    fm = rows["fashion_mnist"]
    assert fm["searched"] and all(isinstance(s, str) for s in fm["searched"])
    assert str(tmp_path) in fm["searched"]
    assert fm["how_to_get"]
    assert fm["found"] is (fm["where"] is not None)


def test_data_text(capsys):
    rc, stdout, _ = cli(capsys, "data")
    assert rc == 0
    assert re.search(r"^digits\s+found: ", stdout, re.M)
    assert re.search(r"^fashion_mnist\s+(found|missing)", stdout, re.M)


def test_data_dir_option_is_searched_first(tmp_path, capsys):
    import numpy as np

    from fedbug.data.idx import write_idx

    rng = np.random.default_rng(0)
    folder = tmp_path / "data"
    folder.mkdir()
    for prefix, n in (("train", 60), ("t10k", 20)):
        write_idx(
            folder / f"{prefix}-images-idx3-ubyte", rng.integers(0, 255, (n, 28, 28), np.uint8)
        )
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", (np.arange(n) % 10).astype(np.uint8))
    cfg = tmp_path / "f.yaml"
    cfg.write_text(
        "dataset: fashion_mnist\nmodel: mlp\nnum_clients: 3\nclients_per_round: 2\n"
        "rounds: 1\nlocal_steps: 1\nbatch_size: 8\n"
    )
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--data-dir", str(folder), "--out", str(out), "-q"]) == 0
    (run,) = list(out.iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["data_dir"] == str(folder)
    part = json.loads((run / "partition.json").read_text())
    assert part["summary"]["num_samples"] == 60


def test_a_reader_that_stops_early_gets_no_error_from_fedbug():
    code = (
        "import sys, fedbug.cli as c\n"
        "def big(args):\n"
        "    for _ in range(200_000):\n"
        "        print('x' * 50)\n"
        "    return 0\n"
        "c.cmd_theory = big\n"
        "sys.exit(c.main(['theory']))\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout.read(10) == b"x" * 10
    p.stdout.close()  # as `fedbug ... | head -c 10` does
    assert p.wait(timeout=60) == 141
    assert p.stderr.read() == b""


def test_data_build_dest_is_dest_slash_name_as_download(tmp_path, capsys, monkeypatch):
    """``--dest X`` builds into X/shakespeare (X/<name>, as ``download`` writes), a folder the
    loader searches under ``data_dir: X``."""
    import fedbug.data.shakespeare_build as build

    seen = []

    def fake(out_dir, **_kw):
        seen.append(out_dir)
        return {"clients": 1, "train_samples": 1, "test_samples": 1, "plays": 1,
                "out_dir": str(out_dir)}  # fmt: skip

    monkeypatch.setattr(build, "build_shakespeare", fake)
    rc, out, err = cli(capsys, "data", "build", "shakespeare", "--dest", str(tmp_path))
    assert rc == 0, err
    assert seen == [tmp_path / "shakespeare"]
    from fedbug.data.locate import candidate_dirs

    assert tmp_path / "shakespeare" in candidate_dirs(tmp_path, "shakespeare")


def test_help_starts_without_importing_torch():
    """`fedbug --help` and the package's import load no PyTorch (0.1 s, not 3 s): fedbug's
    public names load on first use, and the commands import what they need inside."""
    code = (
        "import sys, fedbug, fedbug.cli\n"
        "from fedbug.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert fedbug.run.__module__ == 'fedbug.api' and fedbug.repair is fedbug.repair_run\n"
        "with fedbug.models.allow_import():\n    pass\n"  # subpackages as attributes, as before
        "assert not hasattr(fedbug, 'nosuch')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("ok"), out.stderr


def test_the_readme_command_table_names_every_option_of_every_command():
    """Each option a command's --help shows appears (in its long or short form) in README's
    Command line section, so the table and the parser cannot drift apart."""
    import argparse

    from fedbug.cli import build_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Command line") :]
    section = section[: section.index("\n## ", 5)]

    def options(parser: argparse.ArgumentParser, path: tuple[str, ...]):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from options(sub, (*path, name))
            elif action.option_strings and "--help" not in action.option_strings:
                yield " ".join(path), action.option_strings

    missing = [
        (command, forms)
        for command, forms in options(build_parser(), ())
        if not any(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", section) for f in forms)
    ]
    assert not missing, missing


def test_a_folder_holding_another_configs_finished_run_is_not_called_this_configs(tmp_path):
    """Through the Python API a run folder is given exactly: one that holds another config's
    finished run gets the plain refusal, not "this config's finished run (resume gives its
    result)", which resuming would then refuse."""
    from tiny import tiny_config

    import fedbug
    from fedbug.errors import RunFolderHoldsRun

    a = tiny_config(rounds=1, threads=1, count_flops=False)
    fedbug.run(a, tmp_path / "run")
    with pytest.raises(RunFolderHoldsRun) as same:
        fedbug.run(a, tmp_path / "run")
    assert "this config's finished run" in str(same.value)
    with pytest.raises(RunFolderHoldsRun) as other:
        fedbug.run(a.model_copy(update={"lr": 0.5}), tmp_path / "run")
    assert "already holds a run" in str(other.value)


def test_a_warning_with_a_line_break_stays_one_line(capsys):
    """A warning whose text holds a line break (a path the user gave) is still one line."""
    from fedbug.cli import _one_line_warning

    _one_line_warning("data folder 'a\nb' is empty", UserWarning, "x.py", 1)
    assert capsys.readouterr().err == "fedbug: warning: data folder 'a\\nb' is empty\n"
