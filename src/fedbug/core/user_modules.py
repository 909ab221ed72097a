"""The user's own modules, named on the command line: ``--import MODULE`` imports each before
the config is read, so that what it registers (policies, algorithms, selections, models, data
sets) is known to the config's validation, its "did you mean" and ``fedbug cost``.

``MODULE`` is a module name (``my_policy``, ``lab.methods.policies``), importable from
``PYTHONPATH`` or the installed packages, else from the current folder; or the path of a
``.py`` file, imported under its own name, or under its package's dotted name where its folder
is a package (it holds ``__init__.py``). A folder the module is found in is added at the END of
``sys.path``, never before the installed packages: a file of the user's never stands in for a
module fedbug uses (``--import my/json.py`` is refused: ``json`` is already another module).

A module named on the command line is trusted code, as ``PYTHONPATH`` is (RELIABILITY.md,
"Trust model"); a config can never name one. The processes a command starts import the same
modules: they inherit :data:`IMPORT_ENV` (worker processes, Flower nodes; Ray tasks get it in
their runtime environment), each entry a module name or the absolute path of a ``.py`` file,
separated by ``os.pathsep``, and call :func:`import_from_env` before they build a run. A
module that fails to import is one :class:`~fedbug.errors.ConfigError` line naming it and its
error's last line.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Iterable, Iterator
from importlib.machinery import PathFinder
from pathlib import Path

from fedbug.core.paths import expand_user
from fedbug.core.process import environment_variable
from fedbug.errors import ConfigError

#: the modules the processes a command starts import (``os.pathsep``-separated entries)
IMPORT_ENV = "FEDBUG_IMPORT"

_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def import_modules(given: Iterable[str], option: str = "--import") -> list[str]:
    """Import each module ``given`` (a module name or a ``.py`` file); the entries another
    process imports them by (:data:`IMPORT_ENV`). ``option`` names where they were given, in
    the one-line :class:`ConfigError` of one that cannot be imported."""
    return [_import_one(entry, option) for entry in given]


def import_from_env() -> list[str]:
    """Import the modules :data:`IMPORT_ENV` names (a worker's or a node's first step); the
    entries another process imports them by."""
    return import_modules(env_entries(), IMPORT_ENV)


def env_entries() -> list[str]:
    """The entries :data:`IMPORT_ENV` holds in this process's environment."""
    return [e for e in os.environ.get(IMPORT_ENV, "").split(os.pathsep) if e.strip()]


@contextlib.contextmanager
def imported(given: list[str]) -> Iterator[None]:
    """The command line's modules: those :data:`IMPORT_ENV` already names, then ``given``
    (``--import``), imported here; inside the block every process started inherits them all.
    The environment is as it was after the block (the registrations stay: they are the
    process's)."""
    entries = [*import_from_env(), *import_modules(given)]
    value = os.pathsep.join(dict.fromkeys(entries)) if entries else None
    with environment_variable(IMPORT_ENV, value):
        yield


def code_roots(entries: Iterable[str]) -> list[Path]:
    """Where the code of each imported entry (as :data:`IMPORT_ENV` holds it) lives: its
    outermost package's folder, else its own file; an entry not imported in this process is
    left out. What a cache of things built by that code keys on (the Flower node cache)."""
    roots: list[Path] = []
    for entry in entries:
        if entry.endswith(".py"):
            file = Path(entry)
        else:
            module = sys.modules.get(entry.split(".")[0])
            if module is None or not getattr(module, "__file__", None):
                continue
            file = Path(module.__file__ or "")
        folder = file.parent
        if file.name == "__init__.py" or (folder / "__init__.py").is_file():
            while (folder.parent / "__init__.py").is_file():
                folder = folder.parent
            roots.append(folder)
        else:
            roots.append(file)
    return roots


def _import_one(given: str, option: str) -> str:
    where = f"{option} {given}"
    importlib.invalidate_caches()  # a file written since the last import (a test's, a user's)
    file: Path | None
    root: Path | None
    if given.endswith(".py"):
        name, file, root = _from_file(given, where)
    elif _NAME.fullmatch(given):
        name, file, root = _from_name(given, where)
    else:
        raise ConfigError(f"{where}: give a module name (pkg.module) or a .py file's path")
    if root is not None and str(root) not in sys.path:
        sys.path.append(str(root))  # after the installed packages: never in place of one
    if file is not None:
        _check_same_file(name, file, where)
    try:
        module = importlib.import_module(name)
    except (Exception, SystemExit) as e:
        raise ConfigError(f"{where}: {_last_line(e, file)}") from None
    if file is None and root is not None:  # found in the current folder: others import its file
        file = Path(module.__file__ or "").resolve()
        elsewhere = _dotted(file, where)[0]
        if elsewhere != name:  # the folders' __init__.py files say another name
            raise ConfigError(
                f"{where}: the processes fedbug starts would import its file {file} as "
                f"{elsewhere!r}; pass the file instead: --import {file}"
            )
    canonical = str(file) if file is not None else name
    if os.pathsep in canonical:
        raise ConfigError(f"{where}: a path with {os.pathsep!r} in it cannot be passed on")
    return canonical


def _from_file(given: str, where: str) -> tuple[str, Path, Path]:
    """A ``.py`` file's module name and the folder it is imported from."""
    file = expand_user(given, where).resolve()
    if not file.is_file():
        raise ConfigError(f"{where}: no such file ({file})")
    name, root = _dotted(file, where)
    return name, file, root


def _dotted(file: Path, where: str) -> tuple[str, Path]:
    """The dotted name a file is imported by (its package folders', those that hold
    ``__init__.py``, before its own) and the folder above its outermost package."""
    parts = [] if file.name == "__init__.py" else [file.stem]
    folder = file.parent
    while (folder / "__init__.py").is_file() and folder.name.isidentifier():
        parts.insert(0, folder.name)
        folder = folder.parent
    if not parts or not all(p.isidentifier() for p in parts):
        raise ConfigError(
            f"{where}: {file.name!r} is not a name Python imports; rename it (letters, digits "
            "and _, as my_policy.py)"
        )
    return ".".join(parts), folder


def _from_name(given: str, where: str) -> tuple[str, Path | None, Path | None]:
    """A module name, and the current folder where only it holds the module (None where
    ``PYTHONPATH`` or the installed packages do)."""
    top = given.split(".")[0]
    if top in sys.modules or _findable(top):
        return given, None, None
    here = Path.cwd().resolve()
    if PathFinder.find_spec(top, [str(here)]) is None:
        raise ConfigError(
            f"{where}: no module named {top!r} in the current folder ({here}) or on "
            "PYTHONPATH; run fedbug from its folder, or give its file: --import path/to/it.py"
        )
    return given, None, here


def _findable(top: str) -> bool:
    """Whether a top-level module is found without the current folder (installed, built in,
    on ``PYTHONPATH``)."""
    here = {"", os.curdir, str(Path.cwd().resolve())}
    path = [p for p in sys.path if p not in here]
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(top, path) if finder is PathFinder else find(top, None)
        except (ImportError, ValueError, AttributeError, TypeError):
            continue  # a finder of another kind that cannot say
        if spec is not None:
            return True
    return False


def _check_same_file(name: str, file: Path, where: str) -> None:
    """Refuse a file whose name imports another module (``json.py``: the standard ``json``)."""
    try:
        spec = importlib.util.find_spec(name)
    except (Exception, SystemExit) as e:  # its package's __init__.py failed
        raise ConfigError(f"{where}: {_last_line(e, file)}") from None
    origin = getattr(spec, "origin", None)
    if origin is None or Path(origin).resolve() != file:
        other = origin or "a module already imported"
        raise ConfigError(
            f"{where}: its name {name!r} is already the module {other}; rename the file"
        )


def _last_line(e: BaseException, file: Path | None) -> str:
    """An import's error as its traceback's last line, and where it was raised: the line of
    the module's own file where the traceback passes through it, else its last frame."""
    last = traceback.format_exception_only(type(e), e)[-1].strip()
    if isinstance(e, SyntaxError) and e.filename:
        return f"{last} ({e.filename}, line {e.lineno})"
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if file is not None and Path(f.filename).resolve() == file]
    frame = (own or frames)[-1] if own or frames else None
    return last if frame is None else f"{last} ({frame.filename}, line {frame.lineno})"
