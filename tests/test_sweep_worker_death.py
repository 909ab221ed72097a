"""A sweep's worker process that dies (killed, out of memory, or unable to start) stops the sweep
with one error instead of leaving it waiting forever: multiprocessing's pool starts a new worker
in the dead one's place but never hands it the dead one's run. A user's script that ran
``fedbug.cli.main(["sweep", ..., "--jobs", "2"])`` without the ``if __name__ == "__main__":``
guard (to register a policy of their own first) sat ten minutes with no output, its spawned
workers failing to start one after another."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

KILLED = """\
import os, signal
from pathlib import Path
import fedbug
from fedbug.errors import FedbugError
from fedbug.sweeps.jobs import run_jobs

def die(cfg, run_dir, on_round):
    os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":
    try:
        run_jobs(die, [(fedbug.config(), Path("a"))], 1)
    except FedbugError as e:
        print("stopped:", e.exit_code, e)
"""

# no main-module guard: each spawned worker imports this script and fails to start
UNGUARDED = """\
from pathlib import Path
import fedbug
from fedbug.errors import FedbugError
from fedbug.sweeps.jobs import run_jobs

def idle(cfg, run_dir, on_round):
    return {}

try:
    run_jobs(idle, [(fedbug.config(), Path("a"))], 1)
except FedbugError as e:
    print("stopped:", e.exit_code, e)
"""


def _script(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "sweep_script.py"
    script.write_text(textwrap.dedent(text), encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=90
    )


@pytest.mark.slow
def test_a_killed_worker_stops_the_sweep_with_one_error(tmp_path):
    done = _script(tmp_path, KILLED)  # before: waited forever (the timeout)
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("stopped:")]
    assert line.startswith("stopped: 3 "), line
    assert "worker process" in line and "--resume" in line, line


@pytest.mark.slow
def test_workers_that_cannot_start_stop_the_sweep_naming_the_main_guard(tmp_path):
    done = _script(tmp_path, UNGUARDED)
    lines = [x for x in done.stdout.splitlines() if x.startswith("stopped:")]
    assert lines and 'if __name__ == "__main__":' in lines[-1], done.stdout
