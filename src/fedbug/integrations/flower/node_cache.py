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
Python's versions, and of the files of the modules ``--import`` named), so an edited fedbug or
user module, another data folder or another config never reads a stale entry. Entries are
written atomically (a reader sees a whole file or none; two nodes on one machine writing the
same entry is harmless). A file that cannot be read back is rebuilt and replaced; a client side
that cannot be saved (a user's task holding a lambda) is used unsaved.

The cache folder is the node config's ``cache-dir``, else ``$FEDBUG_NODE_CACHE``, else
``$XDG_CACHE_HOME/fedbug/flower-nodes`` (``~/.cache/...``); ``cache-dir=off`` turns it off.

Entries are Python pickles, and loading a pickle runs whatever it names, so an entry is loaded
only when this user's fedbug wrote it (RELIABILITY.md, "Trust model"): each carries an HMAC-SHA256
of its name and payload under a per-user key (:func:`user_key`, 32 random bytes in
``$FEDBUG_CONFIG_DIR`` else ``$XDG_CONFIG_HOME/fedbug`` else ``~/.config/fedbug``, a 0700 folder,
the file 0600 and this user's), checked before the payload is unpickled. The cache folder is made
0700 and refused, with one warning and no cache, when another user owns it or others may write it;
so is an entry file that is a link or another user's. An entry that fails its check (planted,
copied from another user, damaged) is rebuilt and replaced.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import hmac
import io
import os
import pickle
import platform
import secrets
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedbug.core.user_modules import code_roots, env_entries

OFF = "off"
SUFFIX = ".clientside.pt"
MAGIC = b"FEDBUG-NODE-CACHE-1 "
KEY_NAME = "node-cache.key"
KEY_BYTES = 32
CONFIG_DIR_ENV = "FEDBUG_CONFIG_DIR"


class CacheRefused(Exception):
    """The cache (its folder, key or an entry) cannot be trusted; the message says why."""


def config_dir() -> Path:
    """This user's fedbug folder for secrets: ``$FEDBUG_CONFIG_DIR``, else
    ``$XDG_CONFIG_HOME/fedbug``, else ``~/.config/fedbug``."""
    given = os.environ.get(CONFIG_DIR_ENV)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "fedbug"


def private_folder(folder: Path) -> Path:
    """``folder``, made 0700 where it is new; :class:`CacheRefused` when it is a link, not a
    folder, owned by another user, or writable by others (who could plant entries in it)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError as e:
        raise CacheRefused(f"{folder}: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise CacheRefused(f"{folder} is not a folder (a link or a file)")
    if st.st_uid != os.geteuid():
        raise CacheRefused(f"{folder} belongs to another user (uid {st.st_uid})")
    if st.st_mode & 0o022:
        raise CacheRefused(
            f"{folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"make it private with chmod 700"
        )
    return folder


def _read_own_file(path: Path, limit: int | None = None) -> bytes:
    """A regular file of this user's, not followed through a link; :class:`CacheRefused`
    otherwise (FileNotFoundError where there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise
        raise CacheRefused(f"{path}: {e.strerror or e} (a link is not followed)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheRefused(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise CacheRefused(f"{path} belongs to another user (uid {st.st_uid})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read() if limit is None else f.read(limit)
    finally:
        os.close(fd)


@functools.cache
def _cached_key(path: str) -> bytes:
    return _load_or_make_key(Path(path))


def user_key() -> bytes:
    """This user's node-cache key (made once: 32 random bytes, a 0600 file in a 0700 folder);
    :class:`CacheRefused` when the file is another user's, readable by others, or damaged."""
    return _cached_key(str(config_dir() / KEY_NAME))


def _load_or_make_key(path: Path) -> bytes:
    private_folder(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        raise CacheRefused(f"{path}: {e.strerror or e}") from None
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
    key = _read_own_file(path, KEY_BYTES + 1)
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if mode & 0o077:
        raise CacheRefused(f"{path} is readable by others (mode {mode:o}); chmod 600 it")
    if len(key) != KEY_BYTES:  # a file cut by a crash while it was made: not a key
        raise CacheRefused(f"{path} is not a {KEY_BYTES}-byte key; delete it to make a new one")
    return key


def _signature(key: bytes, name: str, payload: bytes) -> bytes:
    mac = hmac.new(key, name.encode() + b"\0", hashlib.sha256)
    mac.update(payload)
    return mac.hexdigest().encode("ascii")


_warned: set[str] = set()


def _warn(text: str) -> None:
    """One stderr line, once a process (a node process answers many messages)."""
    if text not in _warned:
        _warned.add(text)
        print(f"fedbug: {text}", file=sys.stderr)


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


def user_code_fingerprint() -> str:
    """A hash of the path, size and modification time of the ``.py`` files of the modules
    ``--import`` named (:data:`~fedbug.core.user_modules.IMPORT_ENV`): an edited user policy
    or model makes another key, as an edited fedbug does."""
    h = hashlib.sha256()
    for root in code_roots(env_entries()):
        if root.is_dir():
            h.update(f"{root} {source_fingerprint(root, '')}\n".encode())
        elif root.is_file():
            st = root.stat()
            h.update(f"{root} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def entry_path(folder: Path, parts: tuple[str, ...]) -> Path:
    """The cache file for a build described by ``parts`` (config text, data folder, device),
    under this fedbug's code and the user's imported modules."""
    h = hashlib.sha256(code_fingerprint().encode())
    h.update(b"\0" + user_code_fingerprint().encode())
    for p in parts:
        h.update(b"\0" + p.encode())
    return folder / f"{h.hexdigest()[:32]}{SUFFIX}"


def load_or_build(path: Path | None, build: Callable[[], Any]) -> Any:
    """The object saved at ``path`` by this user's fedbug, else ``build()`` saved there
    (atomically, signed) and returned. A cache that cannot be trusted is not used."""
    if path is None:
        return build()
    try:
        key = user_key()
        private_folder(path.parent)
    except CacheRefused as e:
        _warn(f"node cache not used ({e}); each message builds anew")
        return build()
    try:
        return _load(path, key)
    except FileNotFoundError:
        pass
    except CacheRefused as e:  # planted, another user's, cut: rebuilt and replaced
        _warn(f"node cache entry {path} refused ({e}); rebuilding it")
    except Exception as e:  # signed by us but unloadable (a fedbug that pickled differently)
        _warn(f"node cache entry {path} unreadable ({e}); rebuilding it")
    built = build()
    _save(path, built, key)
    return built


def _load(path: Path, key: bytes) -> Any:
    data = _read_own_file(path)
    head, sep, payload = data.partition(b"\n")
    if not sep or not head.startswith(MAGIC):
        raise CacheRefused("not a fedbug node-cache entry")
    if not hmac.compare_digest(head[len(MAGIC) :], _signature(key, path.name, payload)):
        raise CacheRefused("its signature is not this user's fedbug's")
    return torch.load(io.BytesIO(payload), weights_only=False)


def _save(path: Path, obj: Any, key: bytes) -> None:
    buf = io.BytesIO()
    try:
        torch.save(obj, buf)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        _warn(f"node cache not written ({e}); each message builds anew")
        return
    payload = buf.getvalue()
    data = MAGIC + _signature(key, path.name, payload) + b"\n" + payload
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        _warn(f"node cache not written ({e}); each message builds anew")
