"""Errors that fedbug reports to the user as one line (exit code 2 on the command line, 3 for
a diverged run)."""

from __future__ import annotations


def first_line(
    error_or_text: BaseException | str, *, drop_period: bool = False, empty: str | None = None
) -> str:
    """The first line of an error's message (or of a text), for a one-line message: torch's,
    transformers' and YAML's messages run on over several lines. The text is stripped first,
    so a message opening with a line break still gives its words; ``drop_period`` drops the
    line's trailing ``.`` (for a message that goes on after it). An empty message gives
    ``empty``, or by default the error's type name (``""`` for a text)."""
    text = str(error_or_text).strip()
    if not text:
        if empty is not None:
            return empty
        return "" if isinstance(error_or_text, str) else type(error_or_text).__name__
    line = text.splitlines()[0]
    return line.rstrip(".") if drop_period else line


#: what ``str.splitlines`` breaks a line at, each written as its escape by :func:`one_line`
_LINE_BREAKS: dict[str, str | int | None] = {
    c: repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
}


def one_line(text: str) -> str:
    """``text`` on one line: a line break inside it (a path or a name the user gave holds
    one, an imported module's error runs on) written as its escape, ``\\n``."""
    return text.translate(str.maketrans(_LINE_BREAKS))


class FedbugError(Exception):
    """Base class: a problem with the user's input that they can fix; the message says how.

    The message speaks the Python API (``resume=True``); ``cli_message``, where set, says the
    same in the command line's words (``--resume``), and the CLI prints that one."""

    exit_code = 2
    cli_message: str | None = None


class ConfigError(FedbugError):
    """A config value, override or name is wrong."""


class DataError(FedbugError):
    """A data set is missing, malformed or does not fit the requested use."""


class CheckpointError(FedbugError):
    """A checkpoint or run folder cannot be used."""


class ResultsError(FedbugError):
    """A run folder's results (``metrics.jsonl``, ``summary.json``) are damaged: the message
    names the file, the line and the way out."""


class DivergenceError(FedbugError):
    """Training produced non-finite numbers (a loss or weights); exit code 3."""

    exit_code = 3

    def __init__(self, message: str, round: int, client: int | None, reason: str) -> None:
        super().__init__(message)
        self.round = round
        self.client = client
        self.reason = reason


class ShortRoundError(FedbugError):
    """A round in which fewer than ``min_results`` clients gave a valid update (they timed out,
    failed or sent a malformed one) stopped the run (``on_short_round: stop``), or no round of
    the run was aggregated (``skip``); exit code 3."""

    exit_code = 3

    def __init__(
        self, message: str, round: int, reported: int, selected: int, required: int
    ) -> None:
        super().__init__(message)
        self.round = round
        self.reported = reported
        self.selected = selected
        self.required = required


class RunFolderHoldsRun(ConfigError):
    """A new run was asked for in a folder that already holds one."""

    def __init__(self, path: str, finished: bool = False) -> None:
        if finished:  # settings outside the config hash name the same folder
            said = (
                f"run folder {path!r} already holds this config's finished run ({{resume}} gives "
                "its result); to run it again with settings the folder's name leaves out "
                "(record_updates, the executor, threads) choose another {out}, or remove it"
            )
            super().__init__(said.format(resume="resume=True", out="run_dir"))
            self.cli_message = said.format(resume="--resume", out="--out")
            return
        super().__init__(
            f"run folder {path!r} already holds a run; pass resume=True to continue it or "
            "choose another run_dir"
        )
        self.cli_message = (
            f"run folder {path!r} already holds a run; pass --resume to continue it or choose "
            "another --out"
        )


class RunFolderBusy(FedbugError):
    """Another live process holds the run folder's lock."""


class LinkRefused(FedbugError):
    """A file or folder fedbug would write inside a run (or sweep) folder is a symbolic link
    or not a regular file: it is not followed, since it could point outside the folder."""
