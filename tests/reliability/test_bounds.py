"""Hangs and unbounded resources (issue 28): every loop and every size a user's input sets is
bounded before it runs, and a value past a bound is one error line (exit 2) that says the bound
and the fix: a participation too small for one client a round, --jobs, --seeds, a sweep's
size, theory's sizes, a decompressed data file; and grid values that share a run folder name
are refused naming both."""

from __future__ import annotations

import gzip
import io
import struct
import tarfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml
from tiny import TINY_DOC, tiny_config

from fedbug.cli import main
from fedbug.errors import ConfigError, DataError


class Reached(Exception):
    """Raised by a spy: the code went past the point where a bound should have stopped it."""


def write_config(tmp_path: Path, **over) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**TINY_DOC, "name": "bounds", **over}))
    return path


def one_error_line(rc: int, err: str, *words: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedbug: error: "), err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


# -- 1. participation: a round's draw is bounded -----------------------------------------------


def test_participation_below_one_client_a_round_is_refused_with_the_count_and_the_fix():
    with pytest.raises(ConfigError) as e:
        tiny_config(num_clients=4, clients_per_round=None, participation=0.1)
    msg = str(e.value)
    assert "\n" not in msg
    assert "0.4" in msg  # the expected clients a round
    assert "0.25" in msg and "clients_per_round" in msg  # the fixes
    # one client a round on average is enough
    assert tiny_config(num_clients=4, clients_per_round=None, participation=0.25)


def test_bernoulli_select_refuses_a_participation_that_expects_under_one_client():
    from fedbug.selection.uniform import Bernoulli

    with pytest.raises(ConfigError, match="0.2 clients"):
        Bernoulli(0.01).select(1, 0, 20)
    with pytest.raises(ConfigError, match="participation"):
        Bernoulli(1e-17).select(1, 0, 20)  # looped forever before


def test_bernoulli_redraws_a_bounded_number_of_times(monkeypatch):
    """An rng whose every draw is empty (probability <= e^-1 a draw at one client a round, so
    never in practice) still ends: with one client drawn uniformly from the same stream."""
    from fedbug.selection import uniform

    class EmptyDraws:
        calls = 0

        def random(self, n: int) -> np.ndarray:
            EmptyDraws.calls += 1
            if EmptyDraws.calls > 100_000:
                raise Reached("the redraw loop is unbounded")
            return np.ones(n)

        def integers(self, n: int) -> int:
            return n - 1

    monkeypatch.setattr(uniform, "numpy_rng", lambda *a: EmptyDraws())
    assert uniform.Bernoulli(0.5).select(1, 0, 4) == [3]
    assert EmptyDraws.calls <= uniform.MAX_DRAWS


def test_bernoulli_draws_are_unchanged_where_they_were_fine():
    from fedbug.core.seeding import numpy_rng
    from fedbug.selection.uniform import Bernoulli

    rng = numpy_rng(7, "select", 3)
    while not len(chosen := (rng.random(10) < 0.1).nonzero()[0]):
        pass
    assert Bernoulli(0.1).select(3, 7, 10) == [int(i) for i in chosen]


def test_run_with_too_small_participation_is_one_line_exit_2(tmp_path, capsys):
    cfg = write_config(tmp_path, clients_per_round=None, participation=0.1, rounds=1)
    rc = main(["run", str(cfg), "--out", str(tmp_path / "out"), "-q"])
    one_error_line(rc, capsys.readouterr().err, "participation", "0.4 clients")
    assert not (tmp_path / "out").exists()


# -- 2. --jobs, --seeds, a sweep's size, theory's sizes ----------------------------------------

GRID = {"variant": [{"label": "A", "policy": "none"}, {"label": "B", "policy": "top_down"}]}


def spy_run_jobs(monkeypatch) -> dict:
    seen: dict = {}

    def fake(run_one, jobs, workers, on_round=None, on_done=None):
        seen.update(workers=workers, jobs=[d.name for _, d in jobs])
        raise Reached

    monkeypatch.setattr("fedbug.sweeps.jobs.run_jobs", fake)
    return seen


def test_jobs_are_capped_at_the_runs_of_the_sweep(tmp_path, monkeypatch, capsys):
    seen = spy_run_jobs(monkeypatch)
    cfg = write_config(tmp_path, grid=GRID)
    with pytest.raises(Reached):
        main(["sweep", str(cfg), "--out", str(tmp_path), "-q", "--jobs", "40"])
    assert seen["workers"] == 2 and len(seen["jobs"]) == 2


def test_jobs_are_capped_at_the_runs_left_to_do_on_resume(tmp_path, monkeypatch, capsys):
    cfg = write_config(tmp_path, rounds=1)
    assert main(["sweep", str(cfg), "--out", str(tmp_path), "-q"]) == 0  # base-s0 done
    seen = spy_run_jobs(monkeypatch)
    argv = ["sweep", str(cfg), "--out", str(tmp_path), "-q", "--seeds", "3", "--resume"]
    with pytest.raises(Reached):
        main([*argv, "--jobs", "8"])
    assert seen == {"workers": 2, "jobs": ["base-s1", "base-s2"]}


def test_run_jobs_never_starts_more_workers_than_runs(monkeypatch):
    import multiprocessing as mp

    from fedbug.sweeps import jobs

    sizes = []
    real = mp.get_context

    class Ctx:
        def __init__(self, method):
            self.ctx = real(method)

        def __getattr__(self, name):
            return getattr(self.ctx, name)

        def Pool(self, processes, **kw):  # noqa: N802 - multiprocessing's name
            sizes.append(processes)
            raise Reached

    monkeypatch.setattr(jobs.mp, "get_context", Ctx)
    with pytest.raises(Reached):
        jobs.run_jobs(print, [(tiny_config(), Path("a")), (tiny_config(), Path("b"))], 40)
    assert sizes == [2]


def test_jobs_above_the_cores_warn_in_one_line(tmp_path, monkeypatch, capsys):
    from fedbug.sweeps import jobs

    seen = spy_run_jobs(monkeypatch)
    monkeypatch.setattr(jobs, "available_cores", lambda: 1)
    cfg = write_config(tmp_path, grid=GRID)
    with pytest.raises(Reached):
        main(["sweep", str(cfg), "--out", str(tmp_path), "-q", "--jobs", "2"])
    assert seen["workers"] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedbug: warning: "), err
    assert "2 runs at once" in err[0] and "1 core" in err[0] and "--jobs 1" in err[0]


def test_available_cores_is_this_process_affinity():
    import os

    from fedbug.sweeps.jobs import available_cores

    want = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert available_cores() == want


@pytest.mark.parametrize("seeds", ["100000000", "1001", "0"])
def test_cli_seeds_are_checked_as_the_config_checks_them_before_any_expansion(
    tmp_path, monkeypatch, capsys, seeds
):
    def reached(*a, **k):
        raise Reached

    monkeypatch.setattr("fedbug.sweeps.sweep.run_sweep", reached)
    monkeypatch.setattr("fedbug.sweeps.sweep.expand", reached)
    cfg = write_config(tmp_path, grid=GRID)
    rc = main(["sweep", str(cfg), "--out", str(tmp_path), "-q", "--seeds", seeds])
    one_error_line(rc, capsys.readouterr().err, "--seeds", seeds, "1000")


def test_run_sweep_refuses_seeds_past_the_config_bound(tmp_path):
    from fedbug.sweeps.sweep import run_sweep

    def reached(*a):
        raise Reached

    with pytest.raises(ConfigError, match="1000"):
        run_sweep(dict(TINY_DOC), {}, 1001, tmp_path, reached)


def test_a_sweep_past_the_run_bound_is_refused_before_its_cells_are_built(tmp_path, monkeypatch):
    from fedbug.sweeps import sweep

    def reached(*a):
        raise Reached

    monkeypatch.setattr(sweep, "MAX_SWEEP_RUNS", 10, raising=False)
    grid = {"lr": [0.1, 0.2, 0.3], "momentum": [0.0, 0.5]}  # 6 cells
    with pytest.raises(ConfigError) as e:
        sweep.run_sweep(dict(TINY_DOC), grid, 2, tmp_path, reached)  # 12 runs
    msg = str(e.value)
    assert "12 runs" in msg and "6 cells" in msg and "2 seeds" in msg and "10" in msg
    monkeypatch.setattr(sweep, "validate", reached)  # no cell is built for a huge grid
    huge = {f"k{i}": [0, 1] for i in range(60)}  # 2**60 cells
    with pytest.raises(ConfigError, match="runs"):
        sweep.expand(dict(TINY_DOC), huge)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--clients", "100000000"], ["clients=100000000", "at most 1000"]),
        (["--rounds", "100000000"], ["rounds=100000000", "at most 1000"]),
        (["--clients", "1"], ["clients=1", "at least 2"]),
        (["--eta", *["0.5"] * 120], ["--eta", "120 values", "1 to 100"]),
    ],
)
def test_theory_sizes_are_capped_in_one_line(capsys, argv, words):
    one_error_line(main(["theory", *argv]), capsys.readouterr().err, *words)


def test_theory_checks_every_value_before_computing(monkeypatch):
    from fedbug.report import theory

    def reached(*a, **k):
        raise Reached

    monkeypatch.setattr(theory, "contraction_ratio", reached)
    with pytest.raises(ConfigError, match="clients"):
        theory.theory_report(clients=[2, 10**8])
    with pytest.raises(ConfigError, match="values"):
        theory.theory_report(etas=[0.5] * (theory.MAX_VALUES + 1))


# -- 3. decompressed data: read with a cap ------------------------------------------------------


def idx_header(shape: tuple[int, ...], code: int = 0x08) -> bytes:
    return struct.pack(">HBB", 0, code, len(shape)) + struct.pack(f">{len(shape)}I", *shape)


def gzip_of(parts: list[bytes], zeros: int = 0) -> bytes:
    """gzip of the parts then ``zeros`` zero bytes, compressed as a stream (a bomb stays small
    on disk)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as g:
        for p in parts:
            g.write(p)
        block = bytes(1 << 20)
        while zeros > 0:
            g.write(block[: min(zeros, len(block))])
            zeros -= len(block)
    return buf.getvalue()


def test_a_gzip_bomb_is_refused_without_decompressing_it(tmp_path):
    from fedbug.data.idx import read_idx

    p = tmp_path / "train-labels-idx1-ubyte.gz"
    p.write_bytes(gzip_of([idx_header((10,)), bytes(10)], zeros=64 << 20))  # 64 MiB more
    assert p.stat().st_size < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as e:
            read_idx(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB held to refuse it"
    msg = str(e.value)
    assert str(p) in msg and "\n" not in msg and "corrupt" in msg and "more than 10" in msg


def test_a_header_past_the_cap_is_refused_naming_the_cap(tmp_path):
    from fedbug.data import idx

    p = tmp_path / "train-images-idx3-ubyte.gz"
    p.write_bytes(gzip_of([idx_header((60000, 28, 28 * 1000))]))  # 47 GB declared
    with pytest.raises(DataError) as e:
        idx.read_idx(p)
    msg = str(e.value)
    assert str(p) in msg and "\n" not in msg
    assert "47,040,000,000 bytes" in msg and "1 GiB" in msg


def test_a_plain_file_past_the_cap_is_not_read(tmp_path, monkeypatch):
    from fedbug.data import idx

    monkeypatch.setattr(idx, "MAX_IDX_BYTES", 1000, raising=False)
    p = tmp_path / "x-idx1-ubyte"
    p.write_bytes(idx_header((2000,)) + bytes(2000))
    with pytest.raises(DataError, match="2,000 bytes"):
        idx.read_idx(p)
    ok = tmp_path / "ok-idx1-ubyte"
    ok.write_bytes(idx_header((3,)) + b"abc")
    assert idx.read_idx(ok).tolist() == [97, 98, 99]


def test_a_gzip_bomb_in_data_dir_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from fedbug.data.idx import write_idx

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("t10k", 20)):
        write_idx(data / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), np.uint8))
        write_idx(data / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, n, np.uint8))
    bomb = data / "train-images-idx3-ubyte"
    bomb.unlink()
    bomb = data / "train-images-idx3-ubyte.gz"
    bomb.write_bytes(gzip_of([idx_header((40, 28, 28)), bytes(40 * 28 * 28)], zeros=32 << 20))
    cfg = write_config(tmp_path, dataset="mnist", partition="iid", min_client_samples=0)
    rc = main(["run", str(cfg), "--data-dir", str(data), "--out", str(tmp_path / "out"), "-q"])
    one_error_line(rc, capsys.readouterr().err, str(bomb), "corrupt", "more than")


def test_an_archive_whose_members_expand_past_the_cap_is_refused(tmp_path, monkeypatch):
    from fedbug.data import download

    monkeypatch.setattr(download, "MAX_EXTRACT_BYTES", 1000, raising=False)
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for name, size in (("top/a.bin", 600), ("top/b.bin", 600)):
            info = tarfile.TarInfo(name)
            info.size = size
            tf.addfile(info, io.BytesIO(bytes(size)))
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(DataError) as e:
        download.safe_extract(archive, into, "top")
    msg = str(e.value)
    assert str(archive) in msg and "1,200 bytes" in msg and "1,000" in msg
    assert not any(into.iterdir())


# -- 6. grid values that share a run folder name ------------------------------------------------


def test_grid_values_that_share_a_folder_name_are_refused_naming_both():
    from fedbug.sweeps.sweep import expand

    with pytest.raises(ConfigError) as e:
        expand(dict(TINY_DOC), {"data_dir": ["/d/a b", "/d/a-b"]})
    msg = str(e.value)
    assert "\n" not in msg
    assert "data_dir=/d/a b" in msg and "data_dir=/d/a-b" in msg  # both values
    assert "'data_dir--d-a-b'" in msg and "same run folder name" in msg  # the folder
    assert "appears twice" not in msg


def test_a_value_listed_twice_is_still_appears_twice():
    from fedbug.sweeps.sweep import expand

    with pytest.raises(ConfigError, match="appears twice; list each value once"):
        expand(dict(TINY_DOC), {"lr": [0.1, 0.1]})
