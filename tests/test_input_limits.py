"""Input limits of a config, checked before anything is built from it: the file's size in
bytes, and the values and characters its document holds with YAML aliases expanded (counted
without expanding them). Each refusal is one line naming the limit, in well under a second.
And a NaN for a number says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fedbug.cli import main
from fedbug.config import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_CHARS,
    MAX_CONFIG_VALUES,
    MAX_VALUE_CHARS,
    load_config,
)
from fedbug.errors import ConfigError

#: loose: the limit is "under a second", the machine is shared
FAST_S = 2.0


def string_bomb(aliases: int = 5001, chars: int = 100_000) -> str:
    """One long string aliased many times in a grid (115 KB on disk, 500 MB expanded): it used
    to run and write a 500 MB config.yaml and summary.json."""
    refs = ", ".join(["*s"] * aliases)
    return f"model: mlp\nrounds: 1\ndata_dir: &s {'x' * chars}\ngrid:\n  data_dir: [{refs}]\n"


def list_bomb(levels: int = 7) -> str:
    """A list of 10**levels items in a few lines of anchors (under 500 bytes on disk)."""
    text = "model: mlp\nrounds: 1\ndataset_options:\n"
    for i in range(levels):
        items = ", ".join(["0" if i == 0 else f"*l{i - 1}"] * 10)
        text += f"  l{i}: &l{i} [{items}]\n"
    return text + f"grid:\n  seed: *l{levels - 1}\n"


def many_medium_strings() -> str:
    """Strings under the one-value limit, aliased past the document's character limit."""
    refs = ", ".join(["*s"] * 2_000)
    return f"model: mlp\ndata_dir: &s {'y' * 9_000}\ngrid:\n  data_dir: [{refs}]\n"


def flat_list(items: int = 600_000) -> str:
    """A plain list written out (over 1 MiB): parsing it whole took 31 s before the byte cap."""
    return "model: mlp\ngrid:\n  seed: [" + ", ".join(["0"] * items) + "]\n"


CASES = {
    "string-alias-bomb": (string_bomb(), f"at most {MAX_VALUE_CHARS:,} characters"),
    "list-alias-bomb": (list_bomb(), f"at most {MAX_CONFIG_VALUES:,} values"),
    "strings-past-the-document-limit": (
        many_medium_strings(),
        f"at most {MAX_CONFIG_CHARS:,} characters",
    ),
    "file-over-1-MiB": (flat_list(), f"over {MAX_CONFIG_BYTES:,} bytes"),
}


@pytest.fixture(params=list(CASES), ids=list(CASES))
def bomb(request, tmp_path) -> tuple[Path, str]:
    text, limit = CASES[request.param]
    path = tmp_path / "bomb.yaml"
    path.write_text(text, encoding="utf-8")
    return path, limit


def test_load_config_refuses_at_once_naming_the_limit(bomb):
    path, limit = bomb
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_config(path)
    elapsed = time.perf_counter() - t0
    msg = str(err.value)
    assert limit in msg and str(path) in msg and len(msg.splitlines()) == 1, msg
    assert elapsed < FAST_S, f"refused after {elapsed:.2f} s"


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_the_command_line_refuses_at_once_with_one_line(bomb, tmp_path, capsys, command):
    path, limit = bomb
    out = tmp_path / "out"
    t0 = time.perf_counter()
    code = main([command, str(path), "--out", str(out), "-q"])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("fedbug: error: ") and limit in err, err
    assert elapsed < FAST_S, f"refused after {elapsed:.2f} s"
    assert not out.exists()


def test_an_override_is_held_to_the_same_limits(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("model: mlp\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"at most {MAX_VALUE_CHARS:,} characters"):
        load_config(path, [f"data_dir={'z' * (MAX_VALUE_CHARS + 1)}"])
    bomb = "grid={a: &s " + "w" * 5_000 + ", b: [" + ", ".join(["*s"] * 300) + "]}"
    with pytest.raises(ConfigError, match=f"at most {MAX_CONFIG_CHARS:,} characters"):
        load_config(path, [bomb])


def test_configs_within_the_limits_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    grid = ", ".join(["*d"] * 50)  # aliases that stay small are fine
    path.write_text(f"model: mlp\ndata_dir: &d {'d' * 2_000}\ngrid:\n  data_dir: [{grid}]\n")
    cfg = load_config(path)
    assert cfg.grid is not None and len(cfg.grid["data_dir"]) == 50


@pytest.mark.parametrize("value", ["nan", ".nan", "NaN"])
def test_a_nan_number_says_not_a_number(tmp_path, capsys, value):
    with pytest.raises(ConfigError, match="lr: not a number"):
        load_config(None, [f"lr={value}"], doc={"model": "mlp"})
    path = tmp_path / "c.yaml"
    path.write_text("model: mlp\nrounds: 1\n", encoding="utf-8")
    assert main(["run", str(path), "-s", f"lr={value}", "--out", str(tmp_path / "o"), "-q"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "lr: not a number" in err, err
