"""A node's prepared client side on its own disk, so a ClientApp process built once is loaded,
not rebuilt, by the next.

Flower's deployment runtime (1.41) starts a fresh ClientApp process for every message. Without
this cache each process would load the data set from its files, partition it, build the model
and trace its units before training; with it, the first process on a node saves the built
:class:`~fedbug.engine.experiment.ClientSide` (data as tensors, partition, model template,
units, algorithm and policy) and every later one loads it, so a message costs the interpreter
and torch start-up plus the training.

The key is everything the build depends on: the run's config text, the node's data folder and
device, and the code (fedbug's version and a fingerprint of its source files, torch's and
Python's versions), so an edited fedbug, another data folder or another config never reads a
stale entry. Entries are written atomically (a reader sees a whole file or none; two nodes on
one machine writing the same entry is harmless). A file that cannot be read back is rebuilt and
replaced; a client side that cannot be saved (a user's task holding a lambda) is used unsaved.

The cache folder is the node config's ``cache-dir``, else ``$FEDBUG_NODE_CACHE``, else
``$XDG_CACHE_HOME/fedbug/flower-nodes`` (``~/.cache/...``); ``cache-dir=off`` turns it off.
Entries are Python pickles: the folder must be writable by the node's user only, as its
virtualenv is.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import pickle
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

OFF = "off"
SUFFIX = ".clientside.pt"


def cache_dir(node_config: dict[str, Any]) -> Path | None:
    """The node's cache folder, or None where the node config turns the cache off."""
    given = str(node_config.get("cache-dir", "") or os.environ.get("FEDBUG_NODE_CACHE", ""))
    if given == OFF:
        return None
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fedbug" / "flower-nodes"


@functools.cache
def code_fingerprint() -> str:
    """fedbug's version, the size and modification time of each of its source files, and
    torch's and Python's versions: a change to any makes another key."""
    from fedbug.version import __version__

    package = Path(__file__).resolve().parents[1]  # the fedbug package's folder
    return source_fingerprint(
        package, f"{__version__} {torch.__version__} {platform.python_version()}"
    )


def source_fingerprint(root: Path, versions: str) -> str:
    """A hash of ``versions`` and of the path, size and modification time of every ``.py``
    file under ``root``."""
    h = hashlib.sha256(versions.encode())
    for path in sorted(root.rglob("*.py")):
        st = path.stat()
        h.update(f"{path.relative_to(root)} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def entry_path(folder: Path, parts: tuple[str, ...]) -> Path:
    """The cache file for a build described by ``parts`` (config text, data folder, device)."""
    h = hashlib.sha256(code_fingerprint().encode())
    for p in parts:
        h.update(b"\0" + p.encode())
    return folder / f"{h.hexdigest()[:32]}{SUFFIX}"


def load_or_build(path: Path | None, build: Callable[[], Any]) -> Any:
    """The object saved at ``path``, else ``build()`` saved there (atomically) and returned."""
    if path is None:
        return build()
    try:
        with open(path, "rb") as f:
            return torch.load(f, weights_only=False)
    except FileNotFoundError:
        pass
    except Exception as e:  # a cut or foreign file: rebuilt and replaced
        print(f"fedbug: node cache {path} unreadable ({e}); rebuilding it", file=sys.stderr)
    built = build()
    _save(path, built)
    return built


def _save(path: Path, obj: Any) -> None:
    buf = io.BytesIO()
    try:
        torch.save(obj, buf)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        print(f"fedbug: node cache not written ({e}); each message builds anew", file=sys.stderr)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        print(f"fedbug: node cache not written ({e}); each message builds anew", file=sys.stderr)
