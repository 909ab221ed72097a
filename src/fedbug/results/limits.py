"""How large each file fedbug reads back from a run or sweep folder may be (RELIABILITY.md,
"Trust model": a received folder is data). Each limit is one that no run fedbug can make reaches,
derived below from the config's limits and the schema's maxima (kept here as numbers, since the
results layer imports no config; ``tests/reliability/test_read_bounds.py`` checks that they
agree). A file past its limit is refused before a byte of it is read
(:func:`fedbug.results.files.read_regular`); a JSON file is also refused at its first zero
byte, which no JSON text holds, so a sparse file (its holes read as zeros) is refused after one
chunk whatever its size.

Figures measured on the committed runs (183 curves, 147 summaries): a ``metrics.jsonl``
line is at most 784 bytes besides its per-client fields, and 200 more for each selected client
of a simulated run (FreezeFL's and CoCoFL's ``per_client`` entries); a ``summary.json`` holds
about 7.3 KB besides its per-client lists, and 171 bytes per client in them (a personalized
run of simulated devices: participations, abilities, full-model times, a ``pfl.clients`` row).
"""

from __future__ import annotations

#: the schema's most clients (``num_clients``, fedbug.config.schema): a round may select all
MAX_CLIENTS = 10_000_000
#: the schema's most rounds (``rounds``): a curve has one line per round
MAX_ROUNDS = 1_000_000
#: a config's most characters of keys and values, and most values (fedbug.config.limits)
MAX_CONFIG_CHARS = 1_000_000
MAX_CONFIG_VALUES = 100_000
#: the most runs of one sweep (fedbug.sweeps.sweep.MAX_SWEEP_RUNS)
MAX_SWEEP_RUNS = 10_000

#: the most bytes a resolved config takes as JSON (``indent=1``), inside a summary or a
#: recorded update: each character at most 12 bytes (a character outside the BMP is written
#: as two ``\uXXXX`` escapes), 12,000,000; each value at most 1,008 bytes of indentation,
#: quotes, colon, comma and newline (JSON nests at most ~1,000 deep), 100,800,000; together
#: 112.8 MB, rounded up to 128 MiB
CONFIG_JSON_BYTES = 128 << 20

#: ``summary.json``: its fixed fields (7.3 KB measured) with the config (``CONFIG_JSON_BYTES``)
#: and the model's unit names (128 MiB more: two million names of 60 bytes), 256 MiB; then per
#: client at most 512 bytes (171 measured; at their widest, 267: a participation count of 7
#: digits, an ability and a full-model time of 24 characters each, a ``pfl.clients`` row of
#: 185 and a ``clients_without_test`` entry, with ``indent=1``'s spaces) for the schema's
#: 10,000,000 clients: 5,388,435,456 bytes
MAX_SUMMARY_BYTES = (256 << 20) + 512 * MAX_CLIENTS

#: one ``metrics.jsonl`` line (and one of a thinned curve): its fixed fields (784 bytes
#: measured: figures, server, DP and simulated-clock fields, ``peak_mem_parts``) at most 64 KiB;
#: then per selected client at most 1 KiB (208 measured: an id in ``clients`` and a
#: ``per_client`` entry of 14 keys; at their widest 8 + 600, the rest for a policy's own
#: figures, or a dropped client's one-line reason in its place) for a round that selects all
#: of the schema's 10,000,000 clients: 10,240,065,536 bytes. A curve holds at most
#: ``MAX_ROUNDS`` lines (a thinned one its declaration too), which bounds the file
MAX_METRICS_LINE_BYTES = (64 << 10) + 1024 * MAX_CLIENTS

#: ``sweep.json`` (read only to name a report's groups: one that cannot be read leaves them
#: named by their configs, as for a sweep without one): a row per cell, at most
#: ``MAX_SWEEP_RUNS``, each its figures, its runs' folders and its cell's grid values twice (as
#: values and as its label): about 1.5 KB for a grid of a few short values and 3 seeds. The one
#: limit here that is a choice, not a bound: 26 KiB a row on average, so a sweep of 10,000
#: cells whose grid values take more than about 12,000 bytes a cell (a config may hold
#: 1,000,000 characters, 12 MB in JSON) passes it, and its report names its groups by their
#: configs; covering that would let a received file cost 120 GB of memory for names. 256 MiB
MAX_SWEEP_JSON_BYTES = 256 << 20

#: a recorded update's JSON side (``updates/round-R/client-K.json``): its model options (a
#: config's, ``CONFIG_JSON_BYTES``), then per parameter tensor of the model its name in
#: ``received_names`` and ``params_sent`` and per unit an index in ``units_sent`` (128 MiB:
#: a million tensors of 128 bytes), 256 MiB
MAX_UPDATE_META_BYTES = 256 << 20

#: ``tracking.json``: ``{"mlflow_run_id": ..., "uri": ...}``; the URI a config value (at most
#: 10,000 characters, 120,000 bytes in JSON) or a file URI of a path (4,096 bytes at most):
#: 1 MiB
MAX_TRACKING_BYTES = 1 << 20

#: ``client_states/layout.json``: ``{"num_clients": N, "fields": {name: shape}}``, a field
#: for each tensor of a client's state: the algorithm's (FedDyn's ``lambda``, SCAFFOLD's
#: ``c``) and one per personal unit (``local.U``: at most 40 bytes each); 64 MiB holds 1.6
#: million units, where a model of the 1,000-block limit has about 6,000
MAX_LAYOUT_BYTES = 64 << 20


def checkpoint_limit(weight_bytes: int, num_clients: int) -> int:
    """The most bytes a checkpoint of a run whose weights take ``weight_bytes`` (W) and which has
    ``num_clients`` (N) clients may take: twice what it holds at most, plus 64 MiB (header,
    the simulation's clock, a selection's or policy's own state). It holds the weights (W),
    the server state (at most 4 W: FedDyn's ``lambda_sum``, SCAFFOLD's ``c``, a server
    optimizer's moments), each client's state kept in the checkpoint (at most 2 W: the
    algorithm's, one model at most, and personal units), the local models of
    ``evaluation: mean_of_local_models`` (their sum in float64, 2 W, and one model per client,
    N W), and per client at most 16 KiB of small tensors and the pickle's records for them:
    ``2 * (W * (7 + 3 N) + 16 KiB * N) + 64 MiB``."""
    held = weight_bytes * (7 + 3 * num_clients) + (16 << 10) * num_clients
    return 2 * held + (64 << 20)


def recorded_tensors_limit(values: int, tensors: int) -> int:
    """The most bytes a recorded update's tensor file (``client-K.pt``, ``global.pt``) may take
    where its JSON side says it holds at most ``values`` values in at most ``tensors``
    tensors: the model's weights or the sent parameters' deltas (the flat weights' storage,
    saved once), and a client's true inputs and labels (``num_images`` x the input's size
    each at most). Twice 8 bytes a value (float64 at most) and 4 KiB of the pickle's records
    a tensor, plus 64 MiB: ``2 * (8 * values + 4 KiB * tensors) + 64 MiB``."""
    return 2 * (8 * values + (4 << 10) * tensors) + (64 << 20)
