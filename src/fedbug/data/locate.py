"""Finding a data set's files on disk: search candidate folders for a set of required files.

Every file-based loader (Fashion-MNIST, MNIST, CIFAR, ...) uses the same rule: the first folder
that holds *all* required files wins (each file may be present under any of its accepted names,
plain or compressed); if none does, one :class:`~fedbug.errors.DataError` names every folder
looked in and says how to get the files. Nothing is ever downloaded here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from fedbug.errors import DataError

GZ_SUFFIXES: tuple[str, ...] = ("", ".gz")
"""Accepted suffixes for files that may be stored plain or gzip-compressed."""


def cache_root() -> Path:
    """Per-user data cache, ``~/.cache/fedbug`` (resolved at call time, so ``HOME`` applies)."""
    return Path.home() / ".cache" / "fedbug"


def candidate_dirs(
    data_dir: str | Path | None, subdir: str, system_dirs: Sequence[str | Path] = ()
) -> list[Path]:
    """Folders to search, in order, without duplicates.

    ``<data_dir>`` and ``<data_dir>/<subdir>`` (when ``data_dir`` is given), then
    ``~/.cache/fedbug/<subdir>``, then ``system_dirs``.
    """
    dirs: list[Path] = []
    if data_dir is not None:
        base = Path(data_dir).expanduser()
        dirs += [base, base / subdir]
    dirs.append(cache_root() / subdir)
    dirs += [Path(d).expanduser() for d in system_dirs]
    seen: set[Path] = set()
    unique: list[Path] = []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            unique.append(d)
    return unique


def _find_one(folder: Path, names: Sequence[str], suffixes: Sequence[str]) -> Path | None:
    for name in names:
        for suffix in suffixes:
            p = folder / (name + suffix)
            if p.is_file():
                return p
    return None


def find_in_dir(
    folder: Path, files: Mapping[str, Sequence[str]], suffixes: Sequence[str] = GZ_SUFFIXES
) -> dict[str, Path] | None:
    """``{key: path}`` when ``folder`` holds every file, else ``None``.

    ``files`` maps a key to the accepted file names (first match wins); each name is tried with
    every suffix in ``suffixes``.
    """
    if not folder.is_dir():
        return None
    found: dict[str, Path] = {}
    for key, names in files.items():
        p = _find_one(folder, names, suffixes)
        if p is None:
            return None
        found[key] = p
    return found


def find_files(
    dirs: Sequence[Path], files: Mapping[str, Sequence[str]], suffixes: Sequence[str] = GZ_SUFFIXES
) -> tuple[Path, dict[str, Path]] | None:
    """The first folder in ``dirs`` that holds every file, with the files' paths; else ``None``."""
    for folder in dirs:
        found = find_in_dir(folder, files, suffixes)
        if found is not None:
            return folder, found
    return None


def missing_files_error(
    dataset: str,
    dirs: Sequence[Path],
    files: Mapping[str, Sequence[str]],
    how_to_get: str,
    suffixes: Sequence[str] = GZ_SUFFIXES,
) -> DataError:
    """A :class:`DataError` naming the files wanted, every folder searched, and how to get them.

    A folder that exists but lacks some files is reported with the missing ones.
    """
    wanted = ", ".join(names[0] for names in files.values())
    places = []
    for folder in dirs:
        if folder.is_dir():
            missing = [n[0] for n in files.values() if not _find_one(folder, n, suffixes)]
            places.append(f"{folder} (exists, lacks {', '.join(missing)})")
        else:
            places.append(str(folder))
    gz = " (plain or .gz)" if ".gz" in suffixes else ""
    return DataError(
        f"data set {dataset!r} not found: need {wanted}{gz}; looked in {'; '.join(places)}. "
        f"{how_to_get}"
    )
