"""A Flower node's cache of built client sides holds pickles, and loading a pickle runs what it
names: an entry is loaded only if this user's fedbug signed it (HMAC under a per-user key),
from a private folder of this user's. The drills: an entry planted in a run folder's
``.flower/node-cache`` ran on every message of a ``--resume``; an entry owned by another user
in a world-writable cache folder ran as root."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch

from fedbug.integrations.flower import node_cache
from fedbug.integrations.flower.node_cache import SUFFIX, entry_path, load_or_build, user_key

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


class _Payload:
    """Unpickling it runs a shell command (what a planted entry would do)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _plant(path, marker) -> None:
    buf = io.BytesIO()
    torch.save({"exp": _Payload(f"touch {marker}")}, buf)
    path.write_bytes(buf.getvalue())


@pytest.fixture
def folder(tmp_path):
    f = tmp_path / "cache"
    f.mkdir(mode=0o700)
    return f


def test_a_planted_pickle_is_not_loaded_but_rebuilt_and_signed(folder, tmp_path, capsys):
    path, marker = folder / f"a{SUFFIX}", tmp_path / "pwned"
    _plant(path, marker)
    assert load_or_build(path, lambda: {"w": 1}) == {"w": 1}
    assert not marker.exists()
    assert "refused (not a fedbug node-cache entry)" in capsys.readouterr().err
    assert load_or_build(path, lambda: pytest.fail("our own entry was rebuilt")) == {"w": 1}


def test_an_entry_signed_with_another_key_is_refused(folder, monkeypatch, capsys):
    path = folder / f"b{SUFFIX}"
    load_or_build(path, lambda: [1])
    monkeypatch.setattr(node_cache, "user_key", lambda: b"k" * 32)  # another user's key
    assert load_or_build(path, lambda: [2]) == [2]
    assert "signature is not this user's" in capsys.readouterr().err


def test_an_entry_moved_to_another_name_is_refused(folder, capsys):
    """The signature covers the entry's name (its key): a signed entry of one config copied
    over another's is not read as that one."""
    one, other = folder / f"one{SUFFIX}", folder / f"other{SUFFIX}"
    load_or_build(one, lambda: "one")
    other.write_bytes(one.read_bytes())
    assert load_or_build(other, lambda: "other") == "other"
    assert "signature" in capsys.readouterr().err


def test_a_folder_others_can_write_is_not_used(folder, tmp_path, capsys):
    path, marker = folder / f"c{SUFFIX}", tmp_path / "pwned"
    folder.chmod(0o777)
    _plant(path, marker)
    assert load_or_build(path, lambda: 3) == 3
    assert not marker.exists()
    assert "writable by others (mode 777)" in capsys.readouterr().err
    assert path.read_bytes()[:4] != node_cache.MAGIC[:4]  # nothing written there either


def test_a_linked_entry_is_refused(folder, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere.pt"
    load_or_build(elsewhere_entry := folder / f"d{SUFFIX}", lambda: 4)
    os.replace(elsewhere_entry, elsewhere)
    (folder / f"d{SUFFIX}").symlink_to(elsewhere)
    assert load_or_build(folder / f"d{SUFFIX}", lambda: 5) == 5
    assert "a link is not followed" in capsys.readouterr().err


@needs_root
def test_a_folder_or_an_entry_of_another_user_is_refused(folder, tmp_path, capsys):
    path, marker = folder / f"e{SUFFIX}", tmp_path / "pwned"
    load_or_build(path, lambda: 6)
    os.chown(path, 4321, 4321)  # signed, but now another user's: they could rewrite it
    assert load_or_build(path, lambda: 7) == 7
    assert "belongs to another user (uid 4321)" in capsys.readouterr().err
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 4321, 4321)
    _plant(theirs / f"f{SUFFIX}", marker)
    assert load_or_build(theirs / f"f{SUFFIX}", lambda: 8) == 8
    assert not marker.exists()
    assert "belongs to another user" in capsys.readouterr().err


def test_the_key_is_private_and_made_once(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDBUG_CONFIG_DIR", str(tmp_path / "cfg"))
    node_cache._cached_key.cache_clear()
    try:
        key = user_key()
        path = tmp_path / "cfg" / "node-cache.key"
        assert len(key) == 32 and path.stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "cfg").stat().st_mode & 0o777 == 0o700
        node_cache._cached_key.cache_clear()
        assert user_key() == key
        path.chmod(0o644)
        node_cache._cached_key.cache_clear()
        with pytest.raises(node_cache.CacheRefused, match="readable by others"):
            user_key()
    finally:
        node_cache._cached_key.cache_clear()


def test_a_planted_entry_in_a_received_run_folder_never_runs_in_a_client_app(tmp_path):
    """The drill's path: a ClientApp (what every Flower message starts) given a cache folder
    that holds a planted entry under exactly the name its build would use."""
    pytest.importorskip("flwr")
    from tiny import tiny_config

    import fedbug.integrations.flower.clientapp as clientapp

    cfg = tiny_config(threads=1)
    text = json.dumps(cfg.model_dump(mode="json"))
    received = tmp_path / "run" / ".flower" / "node-cache"
    received.mkdir(parents=True, mode=0o700)
    marker = tmp_path / "pwned"
    _plant(entry_path(received, (text, "", "")), marker)
    node = {"partition-id": 0, "num-partitions": 4, "cache-dir": str(received)}
    for _ in range(3):  # three messages, three processes
        clientapp._CACHE.clear()
        exp, _ = clientapp.experiment_for({"config": text}, node)
        assert exp is not None
    assert not marker.exists()
