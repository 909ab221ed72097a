"""A Flower node's built client side on its disk (:mod:`fedbug.integrations.flower.node_cache`):
the next
ClientApp process loads it instead of rebuilding, trains to the same numbers, and never reads
an entry of another config, data folder or device."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr")

from tiny import tiny_config  # noqa: E402

import fedbug.integrations.flower.clientapp as clientapp  # noqa: E402
from fedbug.core.protocol import ClientTask  # noqa: E402
from fedbug.engine.client import train_client  # noqa: E402
from fedbug.integrations.flower.node_cache import (  # noqa: E402
    SUFFIX,
    cache_dir,
    entry_path,
    load_or_build,
    source_fingerprint,
)


def test_built_once_then_loaded(tmp_path):
    path = tmp_path / f"x{SUFFIX}"
    calls = []

    def build():
        calls.append(1)
        return {"w": torch.arange(4.0)}

    first = load_or_build(path, build)
    again = load_or_build(path, build)
    assert len(calls) == 1 and torch.equal(first["w"], again["w"])
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_a_damaged_entry_is_rebuilt_and_replaced(tmp_path, capsys):
    path = tmp_path / f"x{SUFFIX}"
    path.write_bytes(b"not a torch file")
    assert load_or_build(path, lambda: [1, 2]) == [1, 2]
    assert "refused (not a fedbug node-cache entry)" in capsys.readouterr().err
    assert load_or_build(path, lambda: pytest.fail("rebuilt twice")) == [1, 2]


def test_what_cannot_be_saved_is_used_unsaved(tmp_path, capsys):
    path = tmp_path / f"x{SUFFIX}"
    got = load_or_build(path, lambda: {"f": lambda x: x})  # a lambda does not pickle
    assert got["f"](3) == 3
    assert "not written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_key_is_the_config_the_data_folder_and_the_device(tmp_path):
    base = ("{config}", "/data", "")
    keys = {entry_path(tmp_path, p) for p in
            [base, ("{other}", "/data", ""), ("{config}", "/elsewhere", ""),
             ("{config}", "/data", "cuda:1")]}  # fmt: skip
    assert len(keys) == 4
    assert entry_path(tmp_path, base) == entry_path(tmp_path, base)


def test_an_edited_source_file_or_another_version_is_another_fingerprint(tmp_path):
    import os

    (tmp_path / "sub").mkdir()
    module = tmp_path / "sub" / "m.py"
    module.write_text("x = 1\n")
    first = source_fingerprint(tmp_path, "1.0 torch 2.13")
    assert source_fingerprint(tmp_path, "1.0 torch 2.13") == first
    assert source_fingerprint(tmp_path, "1.1 torch 2.13") != first
    st = module.stat()
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert source_fingerprint(tmp_path, "1.0 torch 2.13") != first


def test_the_folder_from_the_node_config_the_environment_or_the_home(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDBUG_NODE_CACHE", str(tmp_path / "env"))
    assert cache_dir({"cache-dir": str(tmp_path / "node")}) == tmp_path / "node"
    assert cache_dir({}) == tmp_path / "env"
    assert cache_dir({"cache-dir": "off"}) is None
    monkeypatch.delenv("FEDBUG_NODE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir({}) == tmp_path / "xdg" / "fedbug" / "flower-nodes"


def _train(exp, runtime, client=1):
    task = ClientTask(1, client, 0, 0.1, exp.mean_samples, None, 2, None)
    state = exp.algorithm.init_client_state(exp.space)
    return train_client(exp.initial_weights(), task, exp.client_data(client), state, runtime)


def test_a_new_process_loads_the_node_s_client_side_and_trains_the_same(tmp_path, monkeypatch):
    cfg = tiny_config(algorithm="feddyn", policy="bottom_up", threads=1)
    run_config = {"config": json.dumps(cfg.model_dump(mode="json"))}
    node = {"partition-id": 1, "num-partitions": 4, "cache-dir": str(tmp_path)}
    monkeypatch.setattr(clientapp, "_CACHE", {})
    built, runtime = clientapp.experiment_for(run_config, node)
    fresh = _train(built, runtime)
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == 1
    # the next process (an empty in-memory cache) must not build: it loads the entry
    monkeypatch.setattr(clientapp, "_CACHE", {})
    import fedbug.engine.experiment as experiment

    def no_build(*_a, **_k):
        raise AssertionError("built again despite the node cache")

    monkeypatch.setattr(experiment.ClientSide, "__init__", no_build)
    loaded, runtime2 = clientapp.experiment_for(run_config, node)
    assert loaded is not built
    again = _train(loaded, runtime2)
    assert torch.equal(fresh.delta, again.delta)
    assert all(torch.equal(fresh.state[k], again.state[k]) for k in fresh.state)


def test_an_edited_imported_module_is_another_key(tmp_path, monkeypatch):
    """A user module named with --import (a file, and a package by name): editing it changes
    the entry, so a node never loads a client side the old code built."""
    import os
    import sys

    from fedbug.core.user_modules import IMPORT_ENV

    single = tmp_path / "solo_policy_nc.py"
    single.write_text("X = 1\n")
    pkg = tmp_path / "lab_nc" / "methods"
    pkg.mkdir(parents=True)
    (tmp_path / "lab_nc" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "policy.py").write_text("Y = 1\n")
    helper = tmp_path / "lab_nc" / "helpers.py"  # another file of the same package
    helper.write_text("Z = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lab_nc.methods.policy  # noqa: F401  (imported, as --import would)

    monkeypatch.setenv(IMPORT_ENV, os.pathsep.join([str(single), "lab_nc.methods.policy"]))
    base = ("{config}", "/data", "")
    before = entry_path(tmp_path, base)
    assert entry_path(tmp_path, base) == before
    for edited in (single, helper):
        st = edited.stat()
        os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        after = entry_path(tmp_path, base)
        assert after != before, edited.name
        before = after
    monkeypatch.delenv(IMPORT_ENV)
    assert entry_path(tmp_path, base) != before  # without the modules: another key again
    for name in [m for m in sys.modules if m.startswith("lab_nc")]:
        monkeypatch.delitem(sys.modules, name)
