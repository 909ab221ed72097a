"""Run folders: resolved config, partition, metrics.jsonl, summary.json, plot, checkpoint.

Every write that matters is atomic: a temporary file in the same folder, flushed, fsynced and
renamed over the target. A checkpoint carries a SHA-256 of its payload, checked on load, and
loads with ``torch.load(weights_only=True)`` only. ``metrics.jsonl`` gets one whole line per
round; on resume a torn last line is dropped and the rounds after the checkpoint are redone.
While a run writes its folder it holds an OS file lock (``flock``) on ``.lock`` (which names its
pid and a random token); the kernel releases it when the process ends, so a killed run leaves no
stale lock. A process that writes the folder for the holder (Flower's ServerApp, started by the
``fedbug run`` that holds the lock) joins the lock with the token and, before each write, checks
that the holder still holds it: once the holder is gone it stops without writing.

The package's modules: ``files`` (the writes, and the checks before them), ``lock``, ``records``
(checksummed metrics lines and summary.json), ``thinned`` (metrics.thin.jsonl), ``checkpoint``,
``provenance`` (git commit, processor, versions), ``plot``, ``updates`` (the updates a run
records for ``fedbug attack``: ``record_updates``) and ``run_dir`` (:class:`RunDir`);
the names other modules use are imported from here.
"""

from fedbug.results.checkpoint import CHECKPOINT_MAGIC, load_checkpoint_file
from fedbug.results.files import (
    NOFOLLOW,
    SLOW_WRITES_ENV,
    TMP_MARK,
    atomic_write_bytes,
    atomic_write_text,
    check_no_links,
    check_writable,
    open_nofollow,
    open_write,
    refuse_links_below,
)
from fedbug.results.lock import LOCK_NAME, LOCK_TRIES, pid_alive
from fedbug.results.plot import plot_run
from fedbug.results.provenance import cpu_name, environment, git_commit
from fedbug.results.records import (
    CRC_KEY,
    SUMMARY_NAME,
    metrics_line,
    new_records,
    read_summary,
    record_crc,
    summary_problem,
    with_crc,
)
from fedbug.results.run_dir import RunDir
from fedbug.results.thinned import THIN_KEY, THIN_NAME, thinned_rounds

__all__ = [
    "CHECKPOINT_MAGIC",
    "CRC_KEY",
    "LOCK_NAME",
    "LOCK_TRIES",
    "NOFOLLOW",
    "SLOW_WRITES_ENV",
    "SUMMARY_NAME",
    "THIN_KEY",
    "THIN_NAME",
    "TMP_MARK",
    "RunDir",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_no_links",
    "check_writable",
    "cpu_name",
    "environment",
    "git_commit",
    "load_checkpoint_file",
    "metrics_line",
    "new_records",
    "open_nofollow",
    "open_write",
    "pid_alive",
    "plot_run",
    "read_summary",
    "record_crc",
    "refuse_links_below",
    "summary_problem",
    "thinned_rounds",
    "with_crc",
]
