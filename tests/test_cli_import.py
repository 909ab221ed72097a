"""``--import MODULE``: a user's own method, registered in a module of theirs, runs from the
command line (``fedbug run``, ``sweep --jobs``, ``executor: processes``, ``cost``), its name and
options block known to the config; without it the unknown name says how; a module that fails
to import is one line; ``fedbug run`` of a config with a ``grid:`` says it runs without it.

Each test's module has its own name (the registries and ``sys.modules`` are the process's);
what a test imports and registers is taken out again."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from tiny import TINY_DOC, registries_restored, without_timing

from fedbug.algorithms import ALGORITHMS
from fedbug.cli import build_parser, main
from fedbug.core.user_modules import IMPORT_ENV
from fedbug.data import DATASETS
from fedbug.models import MODELS
from fedbug.policies import POLICIES
from fedbug.selection import SELECTIONS

#: a user's policy: FedBABU's rule (the top ``frozen`` units stay frozen), written outside
#: fedbug, with an options block; the same numbers as the built-in fixed_head at frozen=1
POLICY = '''
from pydantic import Field

from fedbug.policies import POLICIES, FreezePolicy, PolicyParams


class Params(PolicyParams):
    frozen: int = Field(1, ge=1)


@POLICIES.register("{name}")
class TopFrozen(FreezePolicy):
    """The top `frozen` units stay frozen."""

    name = "{name}"
    params_cls = Params

    def trainable_units(self, ctx):
        return range(ctx.num_units - self.params.frozen)
'''

#: the same rule without an options block: a config names it by its name alone, so a worker
#: process knows it only where it imported the module itself (nothing in a pickled config
#: refers to the module)
BARE_POLICY = """
from fedbug.policies import POLICIES, FreezePolicy


@POLICIES.register("{name}")
class HeadFrozen(FreezePolicy):
    name = "{name}"

    def trainable_units(self, ctx):
        return range(ctx.num_units - 1)
"""


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """The registries, ``sys.path`` and ``FEDBUG_IMPORT`` as they were before the test, and
    the test's own modules (those under ``tmp_path``) out of ``sys.modules``; runs write no
    per-run plot."""
    path = list(sys.path)
    monkeypatch.delenv(IMPORT_ENV, raising=False)
    monkeypatch.setattr("fedbug.engine.run_folder.plot_run", lambda *a, **k: None)
    with registries_restored(POLICIES, ALGORITHMS, MODELS, DATASETS, SELECTIONS):
        yield
    for name, mod in list(sys.modules.items()):
        if str(getattr(mod, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]
    sys.path[:] = path


def module(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    return path


def config(tmp_path: Path, **keys) -> Path:
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump({**TINY_DOC, **keys}, sort_keys=False), encoding="utf-8")
    return path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def records(out: Path) -> list[dict]:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedbug: error: "), err
    assert "Traceback" not in err
    return lines[0]


# -- run -------------------------------------------------------------------------------------


def test_run_imports_a_policy_file_and_gives_the_builtin_rules_numbers(tmp_path, capsys, isolated):
    """--import path/to/file.py: the user's policy and its options block are known; a run of it
    equals, round for round, the built-in fixed_head (the same rule)."""
    own = module(tmp_path / "mine", "top_frozen_file", POLICY.format(name="top_frozen_a"))
    cfg = config(tmp_path, policy="top_frozen_a", top_frozen_a={"frozen": 1})
    rc, _, err = cli(capsys, "run", str(cfg), "--import", str(own), "--out", str(tmp_path / "a"))
    assert rc == 0, err
    base = config(tmp_path, policy="fixed_head")
    rc, _, err = cli(capsys, "run", str(base), "--out", str(tmp_path / "b"), "-q")
    assert rc == 0, err
    mine, builtin = without_timing(records(tmp_path / "a")), without_timing(records(tmp_path / "b"))
    assert [r["test_acc"] for r in mine] == [r["test_acc"] for r in builtin]
    assert [r["test_loss"] for r in mine] == [r["test_loss"] for r in builtin]
    assert os.environ.get(IMPORT_ENV) is None  # the command's children only


def test_run_imports_a_module_by_name_from_the_current_folder(
    tmp_path, capsys, isolated, monkeypatch
):
    module(tmp_path, "top_frozen_mod", POLICY.format(name="top_frozen_b"))
    monkeypatch.chdir(tmp_path)
    cfg = config(tmp_path, policy="top_frozen_b", top_frozen_b={"frozen": 1})
    rc, out, err = cli(capsys, "run", "my.yaml", "--import", "top_frozen_mod", "--out", "o", "-q")
    assert rc == 0, err
    assert cfg.exists() and "final test accuracy" in out


def test_import_makes_the_options_block_known_to_suggestions(tmp_path, capsys, isolated):
    """A misspelt key of the user's block is answered with the block's key (closest_key reads
    the registries as they are after the import)."""
    own = module(tmp_path, "top_frozen_sugg", POLICY.format(name="top_frozen_c"))
    cfg = config(tmp_path, policy="top_frozen_c", top_frozen_c={"frozn": 1})
    rc, _, err = cli(capsys, "run", str(cfg), "--import", str(own), "--out", str(tmp_path / "o"))
    line = one_error_line(err)
    assert rc == 2
    assert "top_frozen_c.frozn" in line and "'top_frozen_c.frozen'" in line, line


# -- the hint --------------------------------------------------------------------------------


HINT = "a policy of your own: register it in a module and pass --import MODULE"


def test_an_unknown_policy_says_how_to_make_one_known(tmp_path, capsys, isolated):
    cfg = config(tmp_path, policy="random_half")
    rc, _, err = cli(capsys, "run", str(cfg), "--out", str(tmp_path / "o"))
    line = one_error_line(err)
    assert rc == 2
    assert "unknown policy 'random_half'; known: " in line and "bottom_up" in line
    assert line.endswith(HINT), line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("algorithm", "my_algo", "an algorithm of your own: register it in a module"),
        ("model", "my_net", "a model of your own: register it in a module"),
        ("dataset", "my_data", "a data set of your own: register it in a module"),
    ],
)
def test_each_registry_name_says_how(tmp_path, capsys, isolated, key, value, words):
    rc, _, err = cli(capsys, "cost", str(config(tmp_path, **{key: value})))
    line = one_error_line(err)
    assert rc == 2 and f"unknown {key} {value!r}" in line and words in line, line
    assert "--import MODULE" in line


def test_an_unknown_block_of_a_users_policy_says_how(tmp_path, capsys, isolated):
    """The config names the user's policy and holds its block; without the import the block
    is the first thing found unknown: that line says how, too."""
    cfg = config(tmp_path, policy="random_half", random_half={"share": 0.5})
    rc, _, err = cli(capsys, "sweep", str(cfg), "--out", str(tmp_path / "o"))
    line = one_error_line(err)
    assert rc == 2 and "unknown key 'random_half'" in line, line
    assert "register it in a module and pass --import MODULE" in line, line


# -- a module that cannot be imported ----------------------------------------------------------


@pytest.mark.parametrize(
    "text, words",
    [
        ("x = 1\ny = x / 0\n", ["ZeroDivisionError: division by zero", "line 2"]),
        ("def broken(:\n", ["SyntaxError", "line 1"]),
        ("import no_such_module_here\n", ["No module named 'no_such_module_here'"]),
        (POLICY.format(name="none"), ["freeze policy 'none' is registered twice"]),
    ],
    ids=["raises", "syntax", "imports-missing", "duplicate-name"],
)
def test_a_module_that_fails_to_import_is_one_line_exit_2(tmp_path, capsys, isolated, text, words):
    own = module(tmp_path, "broken_mod", text)
    cfg = config(tmp_path)
    rc, _, err = cli(capsys, "run", str(cfg), "--import", str(own), "--out", str(tmp_path / "o"))
    line = one_error_line(err)
    assert rc == 2
    assert f"--import {own}" in line, line
    for w in words:
        assert w in line, (w, line)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "given, words",
    [
        ("no_such_module_xyz", ["no module named 'no_such_module_xyz'", "current folder"]),
        ("missing/file.py", ["no such file"]),
        ("not a name", ["a module name (pkg.module) or a .py file"]),
    ],
)
def test_an_import_that_is_not_found_is_one_line(tmp_path, capsys, isolated, given, words):
    cfg = config(tmp_path)
    rc, _, err = cli(capsys, "cost", str(cfg), "--import", given)
    line = one_error_line(err)
    assert rc == 2 and f"--import {given}" in line, line
    for w in words:
        assert w in line, (w, line)


def test_a_file_whose_name_is_another_module_is_refused(tmp_path, capsys, isolated):
    """my/json.py imported as 'json' would be the json fedbug already uses: refused, not the
    other module run in its place."""
    own = module(tmp_path / "my", "json", POLICY.format(name="top_frozen_d"))
    rc, _, err = cli(capsys, "cost", str(config(tmp_path)), "--import", str(own))
    line = one_error_line(err)
    assert rc == 2 and "'json'" in line and "rename" in line, line


# -- every command that builds runs takes it; never the config -----------------------------------


def test_every_command_that_builds_runs_from_a_config_takes_import():
    parser = build_parser()
    for argv in (
        ["run", "c.yaml"],
        ["sweep", "c.yaml"],
        ["cost", "c.yaml"],
        ["repair", "r"],
        ["attack", "r"],
        ["flower", "worker", "--runtime-api", "h:1", "--insecure"],
    ):
        args = parser.parse_args([*argv, "--import", "a", "--import", "b.py"])
        assert args.imports == ["a", "b.py"], argv


def test_a_config_cannot_import(tmp_path, capsys, isolated):
    own = module(tmp_path, "never_imported", "raise SystemExit('imported')\n")
    for key in ("import", "imports"):
        cfg = config(tmp_path, **{key: [str(own)]})
        rc, _, err = cli(capsys, "cost", str(cfg))
        assert rc == 2 and f"unknown key '{key}'" in one_error_line(err)
    assert "never_imported" not in sys.modules


def test_cost_counts_a_users_policy(tmp_path, capsys, isolated):
    own = module(tmp_path, "top_frozen_cost", POLICY.format(name="top_frozen_e"))
    cfg = config(tmp_path, policy="top_frozen_e")
    rc, out, err = cli(capsys, "cost", str(cfg), "--import", str(own), "--json")
    assert rc == 0, err
    assert json.loads(out)


# -- runs started elsewhere import the same modules -------------------------------------------


@pytest.mark.slow
def test_sweep_jobs_workers_import_the_module(tmp_path, capsys, isolated):
    """sweep --jobs 2: each spawned worker imports the module itself (the policy has no block,
    so nothing in a pickled config would import it) and runs the user's policy; without
    --import the sweep is refused before any worker starts."""
    own = module(tmp_path / "mine", "head_frozen_jobs", BARE_POLICY.format(name="head_frozen_j"))
    cfg = config(tmp_path, policy="head_frozen_j", grid={"lr": [0.05, 0.1]})
    argv = ("sweep", str(cfg), "--jobs", "2", "-q", "--out", str(tmp_path / "o"))
    rc, out, err = cli(capsys, *argv, "--import", str(own))
    assert rc == 0, err
    table = [line for line in out.splitlines() if line.startswith("| lr=")]
    assert len(table) == 2, out
    runs = sorted((tmp_path / "o" / "my-sweep").glob("*-s0"))
    assert len(runs) == 2
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["config"]["policy"] == "head_frozen_j"


@pytest.mark.slow
def test_processes_executor_workers_import_the_module(tmp_path, capsys, isolated):
    """executor: processes: the client workers build the user's policy by name (imported from
    FEDBUG_IMPORT), and give the in-process run's numbers."""
    own = module(tmp_path / "mine", "head_frozen_proc", BARE_POLICY.format(name="head_frozen_p"))
    cfg = config(tmp_path, policy="head_frozen_p")
    rc, _, err = cli(capsys, "run", str(cfg), "--import", str(own), "--out", str(tmp_path / "a"))
    assert rc == 0, err
    procs = ("-s", "executor=processes", "-s", "workers=1")
    rc, _, err = cli(
        capsys, "run", str(cfg), *procs, "--import", str(own), "--out", str(tmp_path / "b")
    )
    assert rc == 0, err
    seq, par = without_timing(records(tmp_path / "a")), without_timing(records(tmp_path / "b"))
    assert [r["test_acc"] for r in seq] == [r["test_acc"] for r in par]


def test_a_ray_task_imports_the_modules_before_it_reads_its_config(tmp_path, isolated, monkeypatch):
    """A Ray task gets its config pickled, and reads it only after importing FEDBUG_IMPORT's
    modules: the pickle of a config that holds a user's options block names the module's
    class, which a worker that has not imported the module cannot find (Ray would fail the
    task before it ran: 'No module named ...'). Here, in this process: the module and its
    folder taken away after pickling, as on a fresh worker."""
    import pickle

    from fedbug.config import load_config
    from fedbug.core.user_modules import import_modules
    from fedbug.sweeps.jobs import run_pickled_job

    own = module(tmp_path / "mine", "top_frozen_ray", POLICY.format(name="top_frozen_r"))
    (entry,) = import_modules([str(own)])
    cfg = load_config(None, doc={**TINY_DOC, "policy": "top_frozen_r"})
    pickled = pickle.dumps(cfg)
    del sys.modules["top_frozen_ray"]
    sys.path.remove(str(own.parent))
    POLICIES._items.pop("top_frozen_r")
    with pytest.raises(ModuleNotFoundError, match="top_frozen_ray"):
        pickle.loads(pickled)

    def run_one(cfg, run_dir, on_round):
        return {"policy": cfg.policy, "frozen": cfg.options("top_frozen_r").frozen}

    monkeypatch.setenv(IMPORT_ENV, entry)
    outcome = run_pickled_job(run_one, 0, pickled, tmp_path / "run")
    assert outcome == ("ok", {"policy": "top_frozen_r", "frozen": 1}, 0)
    monkeypatch.setenv(IMPORT_ENV, str(tmp_path / "gone.py"))
    kind, message, code = run_pickled_job(run_one, 0, pickled, tmp_path / "run")
    assert (
        (kind, code) == ("fedbug", 2) and "FEDBUG_IMPORT" in message and "no such file" in message
    )


def test_a_config_holding_a_block_registered_after_import_pickles(tmp_path, isolated):
    """The config class of a method registered after fedbug.config was imported (a user's
    module that imports it first, or a second --import) is built then: a config of it goes to
    --jobs workers, process executors and Ray tasks pickled, and comes back as the config class
    of the methods registered where it is read."""
    import pickle

    from fedbug.config import config_class, load_config
    from fedbug.core.user_modules import import_modules

    text = "import fedbug.config  # noqa: F401\n" + POLICY.format(name="top_frozen_p2")
    import_modules([str(module(tmp_path, "top_frozen_pickle", text))])
    cfg = load_config(None, doc={**TINY_DOC, "policy": "top_frozen_p2", "top_frozen_p2": {}})
    back = pickle.loads(pickle.dumps(cfg))
    assert type(back) is config_class() and back == cfg
    assert back.options("top_frozen_p2").frozen == 1


# -- fedbug run of a sweep config ---------------------------------------------------------------


def test_run_of_a_config_with_a_grid_says_it_runs_without_it(tmp_path, capsys, isolated):
    grid = {"lr": [0.05, 0.1], "variant": [{"policy": "none"}, {"policy": "fixed_head"}]}
    cfg = config(tmp_path, grid=grid)
    rc, _, err = cli(capsys, "run", str(cfg), "--out", str(tmp_path / "o"), "-q")
    assert rc == 0, err
    assert err.splitlines() == [
        "fedbug: warning: grid: (4 cells) is read by fedbug sweep; fedbug run runs the config "
        "without it"
    ]
    rc, _, err = cli(capsys, "run", str(config(tmp_path)), "--out", str(tmp_path / "p"), "-q")
    assert rc == 0 and err == ""
