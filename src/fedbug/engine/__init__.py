"""The engine: building an experiment (:mod:`.experiment`, :mod:`.dataprep`), the simulated
system (:mod:`.simulation`), the round loop (:mod:`.rounds`), what the server keeps per client
(:mod:`.states`), the run folder (:mod:`.run_folder`), evaluation (:mod:`.evaluation`) and
summaries (:mod:`.summary`); where clients train is the executors' (:mod:`.executors`).

A worker process or a Flower node imports :class:`~fedbug.engine.experiment.ClientSide` and the
client function only, never the loop.
"""

from fedbug.engine.experiment import ClientSide, Experiment, ModelSource
from fedbug.engine.repair import RepairReport, repair_run
from fedbug.engine.rounds import RunResult, run_experiment
from fedbug.engine.summary import weights_sha256

__all__ = [
    "ClientSide",
    "Experiment",
    "ModelSource",
    "RepairReport",
    "RunResult",
    "repair_run",
    "run_experiment",
    "weights_sha256",
]
