"""fedbug: federated learning with layer freezing (FedBug, FreezeFL, FedSeq) on one simulator."""

__version__ = "0.1.0"
