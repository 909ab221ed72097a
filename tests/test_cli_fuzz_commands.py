"""Fuzzing whole argument lists of every ``fedbug`` command that runs without a network or a
Flower/Ray start: ``run``, ``sweep``, ``repair``, ``report``, ``theory``, ``data`` (``list``,
``build`` and ``download`` of names that are refused before any download), ``cost``, ``attack``
and ``flower app``, plus the top level (no command, ``--version``, ``--help``, an unknown
command). Hypothesis mixes valid and invalid option values (numbers out of range, huge, not
numbers, empty, unicode), unknown and misspelled options, repeated options, a missing last value,
``--``, and odd paths (missing, a file where a folder is expected and the reverse, a folder of odd
contents, a FIFO, a dangling link, binary and empty files, names with spaces, newlines and
unicode, a 300-character name, a path past PATH_MAX, ``""``, ``/dev/null``), and sets the
``FEDBUG_*`` environment variables to odd values. ``test_cli_fuzz.py`` fuzzes ``fedbug run``'s
config document and ``-s`` overrides; here the config is the tiny one (one round).

Left out: ``flower worker`` (it connects to a SuperNode's Runtime API over the network),
``sweep --ray`` (it starts or joins a Ray cluster), ``data download`` of a name that would be
downloaded (the network), ``data build shakespeare`` with options it accepts (13 s and 350 MB:
its refusals are fuzzed), and executors other than ``sequential`` (``test_cli_fuzz.py`` caps them
the same way). A few values that would only make a command long are held small where they are
drawn: ``sweep --jobs`` above 1 (worker processes), ``--seeds`` 3 to 99,999 (that many runs),
``theory --clients``/``--rounds`` 11 to 1000, ``attack --iterations`` above 2, and a
``FEDBUG_TEST_SLOW_WRITES`` pause over 0.01 s (its purpose: a drill's slow writes).

The property: each invocation, run in this process through :func:`fedbug.cli.main` in a fresh
folder (the current folder and ``HOME`` inside it), exits 0, 2, 3 or 4; its stderr is empty,
warning lines, or ends in one ``fedbug: error: `` line (exit 2, 3) or is argparse's usage and
error (exit 2); never a traceback; nothing is written outside its folder (the repository's top
level and the folder beside it are checked). ``FEDBUG_FUZZ_EXAMPLES=N`` runs N random examples of
each command instead of the fixed (``derandomize``) few of the default suite.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PLOTS, PLOTS_MODULE
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from tiny import TINY_DOC

from fedbug.cli import main

EXAMPLES = int(os.environ.get("FEDBUG_FUZZ_EXAMPLES", "0"))
TIME_LIMIT_S = 120  # one invocation; a hang fails the example instead of the suite
REPO = Path(__file__).resolve().parents[1]
CONFIG_DOC = {**TINY_DOC, "rounds": 1, "record_updates": [1]}
FEDBUG_VARS = [
    "FEDBUG_MAX_PARAMS",
    "FEDBUG_IMPORT",
    "FEDBUG_ALLOW_IMPORT",
    "FEDBUG_CONFIG_DIR",
    "FEDBUG_NODE_CACHE",
    "FEDBUG_TEST_SLOW_WRITES",
]
TALLY: Counter[str] = Counter()

# -- values -----------------------------------------------------------------------------------

chars = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")  # argv holds no NUL
text = st.text(chars, max_size=12)
ODD = ["", " ", "abc", "-1", "0", "nan", "inf", "-inf", "1e999", "\u00e9t\u00e9", "\U0001f600"]
ODD += ["\n", "1,2", "=", "--", "-", str(2**70), str(-(2**70)), "\u0663", "0x10", "1_0"]


def ints(low: int, high: int, huge_from: int | None = None) -> st.SearchStrategy[str]:
    """Whole numbers as text: ``low..high`` (what the command might run), below 0, huge from
    ``huge_from`` (refused), and the odd texts."""
    huge = st.integers(huge_from or 10**6, 10**30) if huge_from else st.integers(-(10**30), -1)
    valid = st.integers(low, high).map(str)
    return st.one_of(valid, valid, valid, huge.map(str), st.sampled_from(ODD), text).filter(
        lambda s: _small_or_refused(s, high, huge_from)
    )


def _small_or_refused(s: str, high: int, huge_from: int | None) -> bool:
    """Not a whole number (as argparse reads it) between ``high`` and ``huge_from``."""
    try:
        n = int(s)
    except ValueError:
        return True
    return n <= high or huge_from is None or n >= huge_from


floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(-1.5, 1.5).map(lambda x: f"{x:.3g}"),
    st.floats(0, 1).map(lambda x: f"{x:.3g}"),
    st.sampled_from(["0.5", "0.1", "1", "0", "1e-320", "75%", "auto", ".5", "5e-1"]),
    st.sampled_from(["0.5", "0.1", "0.9", "0.25"]),
    st.sampled_from(ODD),
    text,
)


def choice(*valid: str) -> st.SearchStrategy[str]:
    """A valid choice (most often), another case of one, or anything."""
    return st.one_of(
        st.sampled_from(valid),
        st.sampled_from(valid),
        st.sampled_from(valid),
        st.sampled_from([v.upper() for v in valid]),
        st.sampled_from(ODD),
    )


# -- paths ------------------------------------------------------------------------------------

CONTENTS = [
    "config",
    "run",
    "run_damaged",
    "runs_parent",
    "missing",
    "file",
    "binary",
    "empty_file",
    "folder",
    "odd",
    "fifo",
    "dangling",
    "link_to_run",
]
NAMES = {
    "plain": "thing",
    "space": "with a space",
    "newline": "new\nline",
    "unicode": "\u00e9t\u00e9 \u2603 \U0001f600",
    "long": "x" * 300,
    "deep": "/".join(["d" * 200] * 25),
    "dash": "-dash",
}
SPECIALS = ["", ".", "..", "~", "/dev/null", "-", "~nouser/x"]


@dataclass(frozen=True)
class P:
    """A path made in the example's folder when the argument list is run: ``content`` under
    the name ``style``, or one of :data:`SPECIALS` as it is (``raw``)."""

    content: str = "missing"
    style: str = "plain"
    raw: str | None = None
    suffix: str = ""


def paths(*likely: str) -> st.SearchStrategy[P]:
    """A path: one of ``likely`` contents (most often, a plain name), any content under any
    name, or a special."""
    return st.one_of(
        st.sampled_from(likely).map(P),
        st.builds(P, st.sampled_from(CONTENTS), st.sampled_from(sorted(NAMES))),
        st.sampled_from(SPECIALS).map(lambda s: P(raw=s)),
    )


PY_FILES = {
    "ok": "X = 1\n",
    "raise": "raise RuntimeError('boom\\nsecond line')\n",
    "syntax": "def (:\n",
    "exit": "import sys\nsys.exit(3)\n",
    "binary": None,
}
modules = st.one_of(
    st.sampled_from(["os", "json", "nonexistent_fuzz_mod", "fedbug.nonexistent", "fedbug"]),
    st.sampled_from(["", "a b", "..", "1abc", "x.py", "fuzzmod_ok", "os:path", "\u00e9t\u00e9"]),
    st.builds(P, st.sampled_from(sorted(PY_FILES)).map(lambda k: "py_" + k), st.just("plain")),
    st.builds(P, st.sampled_from(["py_ok", "py_raise"]), st.sampled_from(sorted(NAMES))),
    st.builds(P, st.sampled_from(CONTENTS), st.just("plain"), st.none(), st.just(".py")),
)


@dataclass
class Folder:
    """The example's folder: the current folder (``cwd``), ``HOME`` and the paths made."""

    root: Path
    run: Path  # the finished run to copy

    def make(self, p: P) -> str:
        if p.raw is not None:
            return p.raw
        if p.content.startswith("py_"):
            name = f"fuzzmod_{p.content[3:]}_{NAMES[p.style][:40]}.py"
        else:
            name = NAMES[p.style] + p.suffix
        where = self.root / "paths" / f"{len(list((self.root / 'paths').iterdir()))}" / name
        with contextlib.suppress(OSError):  # too long a name, or nested too deep: left missing
            where.parent.mkdir(parents=True, exist_ok=True)
            self._fill(where, p.content)
        return str(where)

    def _fill(self, where: Path, content: str) -> None:
        if content == "config":
            where.write_text(yaml.safe_dump(CONFIG_DOC), encoding="utf-8")
        elif content in ("run", "run_damaged"):
            shutil.copytree(self.run, where)
            if content == "run_damaged":
                metrics = where / "metrics.jsonl"
                data = bytearray(metrics.read_bytes())
                data[len(data) // 2] ^= 0x55
                metrics.write_bytes(bytes(data))
        elif content == "runs_parent":
            shutil.copytree(self.run, where / self.run.name)
        elif content == "file":
            where.write_text("not what you expect\n", encoding="utf-8")
        elif content == "binary":
            where.write_bytes(bytes(range(256)) * 4)
        elif content == "empty_file":
            where.write_bytes(b"")
        elif content == "folder":
            where.mkdir()
        elif content == "odd":
            self._odd(where)
        elif content == "fifo":
            os.mkfifo(where)
        elif content == "dangling":
            where.symlink_to(self.root / "nowhere")
        elif content == "link_to_run":
            shutil.copytree(self.run, self.root / "linked-run", dirs_exist_ok=True)
            where.symlink_to(self.root / "linked-run")
        elif content.startswith("py_"):
            body = PY_FILES[content[3:]]
            if body is None:
                where.write_bytes(b"\xff\xfe\x00junk")
            else:
                where.write_text(body, encoding="utf-8")

    def _odd(self, where: Path) -> None:
        """A folder that looks a little like a run: garbage in its files' places."""
        where.mkdir()
        (where / "config.yaml").write_text("{{{: [\n", encoding="utf-8")
        (where / "summary.json").write_text('{"status": "completed"', encoding="utf-8")
        (where / "metrics.jsonl").write_bytes(b"\xff\n{}\n")
        (where / "checkpoint.pt").write_bytes(b"PK\x03\x04 not a zip")
        (where / "sub").mkdir()
        (where / "sub" / "summary.json").write_text("[]", encoding="utf-8")
        (where / "dangling").symlink_to(where / "nowhere")
        (where / "with\nnewline.json").write_text("null", encoding="utf-8")


# -- argument lists ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Opt:
    """An option's flags (the first most often) and the strategy of its values (a list: nargs;
    None: a flag without a value)."""

    flags: tuple[str, ...]
    values: st.SearchStrategy[list[Any]] | None = None


def one(s: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return s.map(lambda v: [v])


def some(s: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(s, min_size=0, max_size=3)


OVERRIDES = st.sampled_from(
    [
        "rounds=1",
        "rounds=0",
        "rounds=abc",
        "seed=3",
        "seed=-1",
        "lr=nan",
        "lr=0.05",
        "nonkey=1",
        "rounds",
        "=1",
        "",
        "name=\u00e9t\u00e9 \U0001f600",
        "name=a/b",
        "name=..",
        "name=" + "n" * 300,
        "model=os:system",
        "model=nonexistent.module:Thing",
        "data_dir=/dev/null",
        "tracking=[bogus]",
        "grid={lr: [0.1, 0.2]}",
        "grid={lr: []}",
        "grid=abc",
    ]
)
GRIDS = st.sampled_from(
    ["lr=0.1,0.2", "lr=", "=1", "lr", "nokey=1,2", "lr=abc", "seed=1", "lr=0.1,0.1", ",", ""]
)
TRACK = st.sampled_from(["tensorboard", "mlflow", "", ",", "bogus", "tensorboard,bogus", "\u00e9"])
COMMON = {
    "set": Opt(("-s", "--set"), one(OVERRIDES)),
    "import": Opt(("--import",), one(modules)),
    "allow": Opt(("--allow-import",)),
    "quiet": Opt(("-q", "--quiet")),
}
COMMANDS: dict[str, tuple[st.SearchStrategy[list[Any]], dict[str, Opt]]] = {
    "run": (
        one(paths("config", "config", "config")),
        {
            **COMMON,
            "out": Opt(("--out",), one(paths("folder", "missing"))),
            "data-dir": Opt(("--data-dir",), one(paths("folder", "missing"))),
            "resume": Opt(("--resume",)),
            "track": Opt(("--track",), one(TRACK)),
        },
    ),
    "sweep": (
        one(paths("config", "config", "config")),
        {
            **COMMON,
            "grid": Opt(("-g", "--grid"), one(GRIDS)),
            "seeds": Opt(("--seeds",), one(ints(-2, 2, 100_000))),
            "track": Opt(("--track",), one(TRACK)),
            "out": Opt(("--out",), one(paths("folder", "missing"))),
            "data-dir": Opt(("--data-dir",), one(paths("folder", "missing"))),
            "resume": Opt(("--resume",)),
            "jobs": Opt(("-j", "--jobs"), one(ints(-3, 1))),
            "ft": Opt(("--ft",), one(choice("paper", "both"))),
        },
    ),
    "repair": (
        st.lists(paths("run", "run_damaged", "odd", "folder"), min_size=0, max_size=3),
        {k: COMMON[k] for k in ("quiet", "allow", "import")},
    ),
    "report": (
        st.lists(paths("run", "runs_parent", "run_damaged", "odd"), min_size=0, max_size=3),
        {
            "out": Opt(("--out",), one(paths("missing", "folder", "file"))),
            "format": Opt(("--format",), one(st.one_of(choice("png", "pdf", "svg"), TRACK))),
            "json": Opt(("--json",)),
            "ft": Opt(("--ft",), one(choice("paper", "both"))),
            "target": Opt(("--target",), one(floats)),
            "metric": Opt(("--metric",), one(choice("test_acc", "acc_client_mean", "round"))),
            "labels": Opt(("--labels",), one(choice("full", "short"))),
        },
    ),
    "theory": (
        st.just([]),
        {
            "eta": Opt(("--eta",), some(floats)),
            "clients": Opt(("--clients",), some(ints(-2, 10, 1001))),
            "rounds": Opt(("--rounds",), some(ints(-2, 10, 1001))),
            "json": Opt(("--json",)),
        },
    ),
    "data": (
        st.tuples(
            choice("list", "download", "build"),
            st.sampled_from(["shakespeare", "femnist", "bogus", "mnits", "digits"]),
            text,
            st.integers(0, 3),
        ).map(lambda t: list(t[: t[3]])),
        {
            "dest": Opt(("--dest",), one(paths("missing", "folder", "file"))),
            "min": Opt(("--min-samples",), one(ints(-2, 100, 10**6))),
            "fraction": Opt(("--train-fraction",), one(floats)),
            "data-dir": Opt(("--data-dir",), one(paths("folder", "missing", "file"))),
            "json": Opt(("--json",)),
        },
    ),
    "cost": (
        one(paths("config", "config", "config")),
        {
            **{k: COMMON[k] for k in ("set", "import", "allow")},
            "json": Opt(("--json",)),
            "participants": Opt(("--participants",)),
            "samples": Opt(("--samples-per-client",), one(ints(-2, 10**4, 10**9))),
            "out": Opt(("--out",), one(paths("missing", "folder", "file"))),
        },
    ),
    "attack": (
        one(paths("run", "run", "run_damaged", "odd")),
        {
            "import": COMMON["import"],
            "round": Opt(("--round",), one(ints(-1, 3))),
            "client": Opt(("--client",), one(ints(-1, 5))),
            "method": Opt(("--method",), one(choice("auto", "dlg", "idlg", "ig", "ig-unrolled"))),
            "iterations": Opt(("--iterations",), one(ints(-1, 2, 10**30))),
            "seed": Opt(("--seed",), one(st.one_of(ints(-5, 5), st.integers().map(str)))),
            "init": Opt(("--init",), one(choice("normal", "uniform"))),
            "released": Opt(("--released",)),
            "inexact": Opt(("--allow-inexact",)),
            "known": Opt(("--known-order",)),
            "json": Opt(("--json",)),
        },
    ),
    "flower": (
        st.one_of(
            st.tuples(st.just("app"), paths("missing", "folder", "file")).map(list),
            st.lists(st.sampled_from(["app", "worker", "bogus", "--help"]), max_size=2),
        ),
        {},
    ),
}
UNKNOWN = st.one_of(
    st.sampled_from(["--bogus", "--outt", "-z", "--out=", "--=", "---x", "--json=1", "-qq"]),
    text.map(lambda t: "--" + t),
)


@st.composite
def argvs(draw: st.DrawFn, command: str) -> list[Any]:
    """``command``'s positionals and 0-5 options (repeats allowed) in any order, sometimes an
    unknown option, a ``--`` or a missing last value."""
    positionals, options = COMMANDS[command]
    items: list[list[Any]] = [[p] for p in draw(positionals, label="positionals")]
    names = draw(st.lists(st.sampled_from(sorted(options)), max_size=5)) if options else []
    for name in names:
        opt = options[name]
        flag = draw(st.sampled_from(opt.flags), label="flag")
        values = [] if opt.values is None else draw(opt.values, label=name)
        items.append([flag, *values])
    if draw(st.integers(0, 9), label="unknown") == 0:
        items.append([draw(UNKNOWN, label="unknown option")])
    items = draw(st.permutations(items), label="order")
    argv = [command, *(token for item in items for token in item)]
    odd = draw(st.integers(0, 19), label="odd ending")
    if odd == 0 and len(argv) > 1:
        argv.pop()  # an option's value missing, or a positional
    elif odd == 1:
        argv.insert(draw(st.integers(1, len(argv)), label="-- at"), "--")
    return argv


TOP = st.sampled_from(
    [[], ["--version"], ["--help"], ["bogus"], ["-x"], ["flower"], ["run"], ["\u00e9t\u00e9"]]
    + [[c, "--help"] for c in ["run", "sweep", "repair", "report", "theory", "data", "cost"]]
    + [["attack", "--help"], ["flower", "app", "--help"]]
)

env_values = st.one_of(
    st.sampled_from(ODD),
    st.sampled_from(["1", "5000", "1", "true", "yes", " 1 ", "0.5", str(10**40), "os", "json"]),
    st.builds(P, st.sampled_from(CONTENTS), st.sampled_from(sorted(NAMES))),
    text,
)
environments = st.dictionaries(st.sampled_from(FEDBUG_VARS), env_values, max_size=3)


# -- running one invocation ---------------------------------------------------------------------


class TookTooLong(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise TookTooLong(f"an invocation ran past {TIME_LIMIT_S} s")


def _number(argv: list[str], flag: str) -> int | None:
    """The last value of ``flag`` read as argparse's ``int`` would, else None."""
    value = None
    for i, token in enumerate(argv[:-1]):
        if token == flag:
            value = argv[i + 1]
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def caps(argv: list[str]) -> list[str]:
    """What would only make an invocation long, held small: ``attack``'s iterations (2), and a
    ``data build shakespeare`` that would be accepted is not run (``reject``)."""
    if argv[:1] == ["attack"]:
        n = _number(argv, "--iterations")
        if n is None or n > 2:
            argv = [*argv, "--iterations", "2"]
    if argv[:1] == ["data"] and "build" in argv and "shakespeare" in argv:
        from fedbug.data.shakespeare_build import _checked_options

        fraction = "0.8"
        for i, token in enumerate(argv[:-1]):
            if token == "--train-fraction":
                fraction = argv[i + 1]
        try:
            m = _number(argv, "--min-samples")
            _checked_options(64 if m is None else m, float(fraction), 80, None, 2)
        except Exception:  # noqa: BLE001 - refused: run it
            return argv
        reject()
    return argv


@contextlib.contextmanager
def sandbox(base: Path) -> Iterator[tuple[Path, pytest.MonkeyPatch]]:
    """A fresh folder under ``base``, the current folder and ``HOME`` inside it, ``sys.path`` and
    the ``fuzzmod_`` modules put back after it."""
    root = Path(tempfile.mkdtemp(dir=base))
    for sub in ("cwd", "home", "paths"):
        (root / sub).mkdir()
    path, modules = list(sys.path), set(sys.modules)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(root / "cwd")
            mp.setenv("HOME", str(root / "home"))
            for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "MLFLOW_TRACKING_URI", *FEDBUG_VARS):
                mp.delenv(var, raising=False)
            yield root, mp
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            if name.startswith("fuzzmod_"):
                del sys.modules[name]
        shutil.rmtree(root, ignore_errors=True)


def invoke(argv: list[str]) -> tuple[int, str]:
    """``fedbug ARGV`` in this process: (exit code, stderr); a traceback fails the example."""
    err = io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIME_LIMIT_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = main(argv)
            except SystemExit as e:  # argparse: --help, --version (0), a usage error (2)
                rc = e.code if isinstance(e.code, int) else 1
            except Exception:  # noqa: BLE001 - what the user would see
                rc = 1
                err.write(traceback.format_exc())
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return rc, err.getvalue()


WARNING_PREFIXES = ("fedbug: warning: ", "fedbug: note: ", "fedbug attack: ")


def check(rc: int, err: str, argv: list[str]) -> str:
    """The property; returns how the invocation ended (for the tally)."""
    shown = f"fedbug {argv!r} exited {rc}:\n{err}"
    assert "Traceback" not in err, shown
    assert rc in (0, 2, 3, 4), shown
    lines = err.splitlines()
    if rc == 2 and lines and lines[0].startswith("usage: "):
        assert any(line.startswith("fedbug") and ": error: " in line for line in lines), shown
        return "usage"
    if rc in (2, 3):
        *before, last = lines or [""]
        assert last.startswith("fedbug: error: "), shown
        assert all(line.startswith(WARNING_PREFIXES) for line in before), shown
        return "refused"
    if rc == 4:
        assert lines and any(" diverged (" in line for line in lines), shown
        return "diverged"
    assert all(line.startswith(WARNING_PREFIXES) for line in lines), shown
    return "ran"


def outside(base: Path) -> tuple[set[str], set[str]]:
    """What is at the repository's top level and beside the examples' folders."""
    return set(os.listdir(REPO)), set(os.listdir(base.parent))


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Path, Path]]:
    """A finished one-round run of the tiny config (its update recorded, for ``attack``) and
    the folder the examples' folders are made in."""
    from fedbug.api import run
    from fedbug.config import load_config

    with tempfile.TemporaryDirectory(prefix="fedbug-cli-fuzz-") as tmp:
        base = Path(tmp) / "examples"
        base.mkdir()
        made = Path(tmp) / "run"
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("HOME", tmp)
            for name in PLOTS:  # as no_plots does for a test
                mp.setattr(f"{PLOTS_MODULE}.{name}", lambda *_a, **_k: None)
            run(load_config(None, doc=dict(CONFIG_DOC)), made)
        yield base, made
    print(f"\ncli commands fuzz: {dict(sorted(TALLY.items()))}")


def _pauses(value: str) -> bool:
    """Whether ``FEDBUG_TEST_SLOW_WRITES=value`` is a pause the drills ask for (over 0.01 s a
    write: held back, as it only makes the command long)."""
    try:
        return 0.01 < float(value) <= 86_400
    except ValueError:
        return False


def fuzz(world: tuple[Path, Path], argv: list[Any], env: dict[str, Any]) -> None:
    base, made = world
    before = outside(base)
    with sandbox(base) as (root, mp):
        folder = Folder(root, made)
        argv = caps([folder.make(a) if isinstance(a, P) else a for a in argv])
        for var, value in env.items():
            value = folder.make(value) if isinstance(value, P) else value
            if not (var == "FEDBUG_TEST_SLOW_WRITES" and _pauses(value)):
                mp.setenv(var, value)
        rc, err = invoke(argv)
    ended = check(rc, err, argv)
    TALLY[f"{argv[0] if argv else '-'} {ended}"] += 1
    assert outside(base) == before, f"fedbug {argv!r} wrote outside its folder"


def fuzz_settings(n: int) -> settings:
    return settings(
        max_examples=EXAMPLES or n,
        derandomize=not EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )


# -- the properties -------------------------------------------------------------------------------
# the suite's examples a command: the slow ones (a run, a rerun, an attack) fewer

SUITE = {
    "run": 6,
    "sweep": 5,
    "repair": 6,
    "report": 8,
    "theory": 10,
    "data": 12,
    "cost": 6,
    "attack": 4,
    "flower": 6,
}


def _test(command: str) -> Any:
    @fuzz_settings(SUITE[command])
    @given(argv=argvs(command), env=environments)
    def test(world, no_plots, argv, env):
        fuzz(world, argv, env)

    test.__name__ = f"test_fedbug_{command}_exits_0_2_3_4_with_one_error_line"
    return test


for _command in COMMANDS:
    globals()[f"test_fedbug_{_command}_exits_0_2_3_4_with_one_error_line"] = _test(_command)


@fuzz_settings(10)
@given(argv=TOP, env=environments)
def test_the_top_level_exits_0_or_2(world, argv, env):
    fuzz(world, list(argv), env)


# -- what the fuzzing found (fixed cases) ---------------------------------------------------------


def one_error_line(argv: list[str]) -> str:
    rc, err = invoke(argv)
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("fedbug: error: "), err
    return err


def test_an_error_naming_a_line_break_is_one_line(tmp_path, monkeypatch):
    """A path with a newline in it, an imported module's two-line error: the break written as
    ``\\n`` (was two stderr lines, the second without ``fedbug: error:``)."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(CONFIG_DOC), encoding="utf-8")
    (tmp_path / "new\nline").write_text("a file, not a folder", encoding="utf-8")
    err = one_error_line(["cost", str(config), "--out", str(tmp_path / "new\nline")])
    assert "new\\nline: File exists" in err
    (tmp_path / "fuzzmod_two_lines.py").write_text("raise RuntimeError('boom\\nagain')\n")
    try:
        err = one_error_line(["cost", str(config), "--import", "fuzzmod_two_lines.py"])
    finally:
        sys.modules.pop("fuzzmod_two_lines", None)
    assert "RuntimeError: boom\\nagain (" in err
    assert "give a module name" in one_error_line(["cost", str(config), "--import", "a\u2028b"])


@pytest.mark.parametrize(
    "argv",
    [
        ["data", "--data-dir", "~nouser_fuzz/x"],
        ["data", "download", "bogus", "--dest", "~nouser_fuzz"],
        ["run", "CONFIG", "--data-dir", "~nouser_fuzz/x", "--out", "OUT"],
        ["cost", "CONFIG", "-s", "data_dir=~nouser_fuzz"],
        ["cost", "CONFIG", "--import", "~nouser_fuzz/m.py"],
    ],
    ids=["data-list", "data-download", "run", "cost-data-dir", "import"],
)
def test_a_home_of_no_user_is_one_line(tmp_path, argv):
    """``~user`` of no user (was pathlib's ``RuntimeError`` traceback; ``run`` after it had
    made ``--out``)."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(CONFIG_DOC), encoding="utf-8")
    subs = {"CONFIG": str(config), "OUT": str(tmp_path / "out")}
    err = one_error_line([subs.get(a, a) for a in argv])
    assert "~nouser_fuzz names no home folder on this machine" in err, err
    assert "give the folder's full path" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["abc", " ", "nan", "-1", "inf", "1e999", "\u00e9"])
def test_a_slow_writes_value_of_no_seconds_is_one_warning(tmp_path, monkeypatch, value):
    """``FEDBUG_TEST_SLOW_WRITES`` (a drill's pause in each write) that is no number of seconds:
    the write done, one warning, no pause (was ``ValueError`` or ``OverflowError`` mid-write)."""
    import warnings

    from fedbug.results.files import atomic_write_bytes

    monkeypatch.setenv("FEDBUG_TEST_SLOW_WRITES", value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        atomic_write_bytes(tmp_path / "x.bin", b"data")
    assert (tmp_path / "x.bin").read_bytes() == b"data"
    said = [str(w.message) for w in caught]
    assert value.strip() == "" and not said or len(said) == 1 and "ignored" in said[0], said
