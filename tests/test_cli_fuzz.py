"""Fuzzing whole ``fedbug run`` invocations: hypothesis derives config documents from the tiny
CLI config (keys dropped, replaced by garbage, misspelled, unknown keys added, nested garbage,
the whole document replaced) and adds ``-s key=value`` overrides (valid, misspelled and random
keys; wrong types, out-of-range and huge numbers, empty and unicode strings, YAML lists and
mappings). Each invocation either runs its one short round (exit 0, one metrics line) or is
refused with exit 2 and one line on stderr, no traceback, and nothing in ``--out``.

A config that validates but would run long (more rounds or steps, many clients, another
executor, more threads) gets capping overrides appended (later overrides win), so an accepted
config is still run, one short round. ``FEDBUG_FUZZ_EXAMPLES=N`` runs N random examples instead
of the fixed 60 (``derandomize``) of the default suite.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import TINY_DOC

from fedbug.algorithms import ALGORITHMS
from fedbug.cli import main
from fedbug.config import all_keys, load_config
from fedbug.data import DATASETS
from fedbug.models import MODELS
from fedbug.policies import POLICIES

BASE = {**TINY_DOC, "rounds": 1}
KEYS = all_keys()
TOP_KEYS = sorted({k.split(".")[0] for k in KEYS})
EXAMPLES = int(os.environ.get("FEDBUG_FUZZ_EXAMPLES", "0"))
TIME_LIMIT_S = 60  # one invocation; a hang fails the example instead of the suite

# -- strategies -------------------------------------------------------------------------------

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)  # any unicode, no surrogates
numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-320, 1e300, float("inf"), float("nan")]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    numbers,
    text,
    st.sampled_from(["", " ", "\u00e9t\u00e9", "\u4e2d\u6587", "\U0001f600", "1e999", "nan", "~"]),
)
garbage = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(text, st.integers()), inner, max_size=3),
    ),
    max_leaves=6,
)

# values a key might well be given: small numbers, the registered names, the keys' literals
LITERALS = [
    "iid",
    "dirichlet",
    "natural",
    "adam",
    "uniform",
    "full",
    "personalized",
    "anti",
    "skip_client",
]
NAMES = sorted(
    {*ALGORITHMS.names(), *MODELS.names(), *DATASETS.names(), *POLICIES.names(), *LITERALS}
)
plausible = st.one_of(
    st.integers(-1, 10),
    st.floats(-0.5, 1.5),
    st.sampled_from(NAMES),
    st.lists(st.integers(0, 5), max_size=3),
)
values = st.one_of(garbage, plausible)


def misspell(key: str, data: st.DataObject) -> str:
    """One typo: a character dropped, doubled, swapped with the next, or replaced."""
    if not key:
        return "x"
    i = data.draw(st.integers(0, len(key) - 1), label="typo at")
    kind = data.draw(st.sampled_from(["drop", "double", "swap", "replace"]), label="typo")
    if kind == "drop" and len(key) > 1:
        return key[:i] + key[i + 1 :]
    if kind == "swap" and i + 1 < len(key) and key[i] != key[i + 1]:
        return key[:i] + key[i + 1] + key[i] + key[i + 2 :]
    if kind == "replace":
        c = data.draw(st.sampled_from("aeiouxz_"), label="typo char")
        if c != key[i]:
            return key[:i] + c + key[i + 1 :]
    return key[:i] + key[i] + key[i:]


@st.composite
def documents(draw: st.DrawFn) -> Any:
    """TINY_DOC (one round) with 0-4 mutations, or (rarely) something that is no mapping."""
    if draw(st.integers(0, 19), label="whole document") == 0:
        return draw(garbage, label="document")
    doc: dict[Any, Any] = dict(BASE)
    data = draw(st.data())
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 2, 3, 4]), label="mutations")):
        kind = draw(st.sampled_from(["drop", "replace", "misspell", "unknown", "nested"]))
        keys = sorted(k for k in doc if isinstance(k, str))
        if kind == "drop" and keys:
            doc.pop(draw(st.sampled_from(keys), label="drop"), None)
        elif kind == "replace":
            key = draw(st.sampled_from(TOP_KEYS), label="replace")
            doc[key] = draw(values, label="value")
        elif kind == "misspell" and keys:
            key = draw(st.sampled_from(keys), label="misspell")
            doc[misspell(key, data)] = doc.pop(key)
        elif kind == "unknown":
            doc[draw(st.one_of(text, st.integers()), label="unknown key")] = draw(garbage)
        else:
            block = draw(st.sampled_from(["fedprox", "system", "model_options", "reputation"]))
            doc[block] = draw(st.dictionaries(text, garbage, max_size=3), label="nested")
    return doc


@st.composite
def overrides(draw: st.DrawFn) -> list[str]:
    """0-3 ``key=value`` texts."""
    out = []
    data = draw(st.data())
    for _ in range(draw(st.integers(0, 3), label="overrides")):
        key = draw(
            st.one_of(
                st.sampled_from(KEYS),
                st.sampled_from(KEYS).map(lambda k: misspell(k, data)),
                text,
            ),
            label="override key",
        )
        value = draw(
            st.one_of(
                text,
                values.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip()),
                numbers.map(str),
            ),
            label="override value",
        )
        sep = draw(st.sampled_from(["=", "=", "=", ""]), label="separator")
        out.append(f"{key}{sep}{value}")
    return out


# -- running one invocation ------------------------------------------------------------------


def caps(path: Path, sets: list[str]) -> list[str]:
    """Overrides that bring an accepted config down to one short round; [] for a refused one
    (whatever load_config raises besides ConfigError, the CLI then has to refuse)."""
    try:
        cfg = load_config(path, sets)
    except Exception:  # noqa: BLE001
        return []
    out = []
    if cfg.rounds > 1:
        out.append("rounds=1")
    if cfg.local_steps is None or cfg.local_steps > 4:
        out.append("local_steps=2")
    if cfg.num_clients > 20 or (cfg.clients_per_round or 0) > 4:
        out += ["num_clients=4", "clients_per_round=2"]
    if cfg.executor != "sequential":
        out.append("executor=sequential")
    if cfg.threads is None or cfg.threads > 2:
        out.append("threads=1")
    if cfg.finetune_epochs > 1 and cfg.evaluation == "personalized":
        out.append("finetune_epochs=1")
    if cfg.eval_batch_size < 64:
        out.append("eval_batch_size=512")
    if cfg.batch_size < 4:
        out.append("batch_size=16")
    return out


class TookTooLong(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise TookTooLong(f"an invocation ran past {TIME_LIMIT_S} s")


def invoke(tmp: Path, doc: Any, sets: list[str], cap: bool = False) -> tuple[int, str, Path]:
    """``fedbug run`` in this process; (exit code, stderr, --out). ``cap``: append the
    :func:`caps` of an accepted config."""
    cfg = tmp / "fuzz.yaml"
    cfg.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    out = tmp / "out"
    if cap:
        capped = caps(cfg, sets)
        TALLY["capped"] += bool(capped)
        sets = [*sets, *capped]
    argv = ["run", str(cfg), "--out", str(out), "-q"]
    for s in sets:
        argv += ["-s", s] if not s.startswith("-") else [f"--set={s}"]
    err = io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIME_LIMIT_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return rc, err.getvalue(), out


TALLY = {"examples": 0, "ran": 0, "refused": 0, "capped": 0}


@pytest.fixture(scope="module")
def fuzz_env():
    """An empty HOME for the module (no data set but digits is found)."""
    with tempfile.TemporaryDirectory() as home, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", home)
        yield
    print(f"\ncli fuzz: {TALLY}")


@settings(
    max_examples=EXAMPLES or 60,
    derandomize=not EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(doc=documents(), sets=overrides())
def test_any_invocation_runs_one_round_or_is_one_line_exit_2(fuzz_env, no_plots, doc, sets):
    with tempfile.TemporaryDirectory() as tmp:
        rc, err, out = invoke(Path(tmp), doc, sets, cap=True)
        TALLY["examples"] += 1
        assert rc in (0, 2), err
        if rc == 2:
            TALLY["refused"] += 1
            assert "Traceback" not in err, err
            lines = err.splitlines()
            assert len(lines) == 1 and lines[0].startswith("fedbug: error: "), err
            assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))
        else:
            TALLY["ran"] += 1
            (metrics,) = out.glob("*/metrics.jsonl")
            lines = metrics.read_text(encoding="utf-8").splitlines()
            assert len(lines) == 1 and json.loads(lines[0])["round"] == 1


# -- the closest valid key -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "sets", "wrong", "right"),
    [
        ({**BASE, "lerning_rate": 0.1}, [], "lerning_rate", "lr"),
        ({**BASE, "rouns": 1}, [], "rouns", "rounds"),
        (BASE, ["partcipation=0.2"], "partcipation", "participation"),
        (BASE, ["fedprox.muu=0.1"], "fedprox.muu", "fedprox.mu"),
        (BASE, ["num_client=4"], "num_client", "num_clients"),
        (BASE, ["bach_size=8"], "bach_size", "batch_size"),
    ],
)
def test_a_misspelled_key_names_the_closest_valid_key(tmp_path, no_plots, doc, sets, wrong, right):
    rc, err, out = invoke(tmp_path, doc, sets)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"unknown key {wrong!r}; did you mean {right!r}?" in err
    assert not out.exists()


BOMB = "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}' if i else 'x'] * 9)}]\n" for i in range(9)
)  # nine lines that expand to 9**9 values


@pytest.mark.parametrize(
    ("text", "sets"),
    [
        ("model: mlp\nmodel_options:\n" + "".join(f"  {line}\n" for line in BOMB.splitlines()), []),
        ("model: mlp\ngrid:\n" + "".join(f"  {line}\n" for line in BOMB.splitlines()), []),
        ("model: mlp\nmodel_options: &a {x: *a}\n", []),  # refers to itself
        ("model: mlp\n", ["grid={a: &b [*b, *b]}"]),
    ],
    ids=["alias-bomb-options", "alias-bomb-grid", "self-reference", "self-reference-override"],
)
def test_yaml_alias_bombs_are_refused_at_once(tmp_path, no_plots, text, sets):
    """A few lines of YAML anchors expand to 387 million values (hashing or writing the config
    hung); a mapping that contains itself never ends."""
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    argv = ["run", str(cfg), "--out", str(out), "-q", *(f"--set={s}" for s in sets)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(argv) == 2
    assert len(err.getvalue().splitlines()) == 1 and "at most 100,000 values" in err.getvalue()
    assert not out.exists()


def test_negative_model_width_is_one_line(tmp_path, no_plots):
    rc, err, out = invoke(tmp_path, BASE, ["model_options={hidden: [-3]}"])
    assert rc == 2 and len(err.splitlines()) == 1, err
