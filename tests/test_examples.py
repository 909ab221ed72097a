"""Every script in examples/ runs as a user would run it (a fresh interpreter), in seconds."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {
        "own_regression.py",
        "own_split.py",
        "own_model_flower.py",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, tmp_path):
    if "flower" in path.name:
        pytest.importorskip("flwr")
    done = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()
