"""Errors that fedbug reports to the user as one line (exit code 2 on the command line)."""

from __future__ import annotations


class FedbugError(Exception):
    """Base class: a problem with the user's input that they can fix; the message says how."""

    exit_code = 2


class ConfigError(FedbugError):
    """A config value, override or name is wrong."""


class DataError(FedbugError):
    """A data set is missing, malformed or does not fit the requested use."""


class CheckpointError(FedbugError):
    """A checkpoint or run folder cannot be used."""
