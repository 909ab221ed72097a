"""Paths the user gives, with ``~`` expanded: ``~user`` of a user this machine does not know
is one :class:`~fedbug.errors.ConfigError` line, not pathlib's ``RuntimeError``."""

from __future__ import annotations

from pathlib import Path

from fedbug.errors import ConfigError


def expand_user(given: str | Path, what: str) -> Path:
    """``given`` with a leading ``~`` or ``~user`` expanded; ``what`` names where it was given
    (``--data-dir DIR``) in the refusal of a ``~user`` that cannot be expanded."""
    path = Path(given)
    try:
        return path.expanduser()
    except RuntimeError:  # no such user, or no home folder for ~ (HOME unset, no passwd entry)
        head = str(given).split("/", 1)[0]
        raise ConfigError(
            f"{what}: {head} names no home folder on this machine (no such "
            "user); give the folder's full path"
        ) from None
