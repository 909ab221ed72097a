"""Client selections, one file each; importing this package registers them all: every module
in it is imported, so a new one is a new file."""

from fedbug.core.registry import register_all
from fedbug.selection.base import SELECTIONS, Selection, SelectionFeedback
from fedbug.selection.rbcsf import Rbcsf, RbcsfParams
from fedbug.selection.reputation import Reputation, ReputationParams
from fedbug.selection.uniform import Bernoulli, UniformCount

__all__ = [
    "SELECTIONS",
    "Bernoulli",
    "Rbcsf",
    "RbcsfParams",
    "Reputation",
    "ReputationParams",
    "Selection",
    "SelectionFeedback",
    "UniformCount",
]

register_all(__name__, __path__)
