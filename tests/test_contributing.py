"""CONTRIBUTING.md's code blocks run as they are: a toy algorithm and a toy policy, registered
and run by name (then taken out of the registries again)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tiny import registries_restored

from fedbug.algorithms import ALGORITHMS
from fedbug.policies import POLICIES

GUIDE = Path(__file__).resolve().parents[1] / "CONTRIBUTING.md"


@pytest.fixture
def clean_registries():
    with registries_restored(ALGORITHMS, POLICIES):
        yield


def test_guide_examples_run(clean_registries):
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 3
    scope: dict = {}
    exec(blocks[0], scope)
    exec(blocks[1], scope)
    exec(blocks[2], scope)
    assert scope["result"].summary["config"]["toyprox"] == {"mu": 0.01}
