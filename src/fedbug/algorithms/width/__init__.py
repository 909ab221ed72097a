"""Width sub-model methods: every client trains a narrower network cut from the global model
(HeteroFL in ``heterofl.py``), all on one planner (``planner.py``: channel groups, index sets,
masks). Importing this package registers every method module in it."""

from fedbug.core.registry import register_all

register_all(__name__, __path__)
