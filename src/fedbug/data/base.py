"""The in-memory data set every experiment reads from.

A data set is loaded once into tensors (images as uint8, converted per batch); a client's data is
an index tensor into them, and a batch is an index into that. Nothing is decoded inside the round
loop. ``natural_clients`` / ``natural_test_clients`` list each natural client's train / test
indices (LEAF writers, speaking roles); ``augmentation`` names the data set's default training
augmentation (see :mod:`fedbug.data.augment`).

:class:`FederatedDataset` takes data as users have it (tensors, numpy arrays, lists of numbers;
a per-client split with :meth:`FederatedDataset.from_clients`; Hugging Face ``datasets`` with
:meth:`FederatedDataset.from_huggingface`) and checks it once, raising one
:class:`~fedbug.errors.DataError` that names the problem and the fix.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from fedbug.core.device import from_host, take_rows
from fedbug.core.finite import all_finite
from fedbug.core.protocol import ClientData
from fedbug.core.registry import Registry
from fedbug.errors import DataError

# elements per block when counting non-finite inputs (bounds the temporary mask's memory)
_FINITE_BLOCK = 1 << 24


@dataclass
class FederatedDataset:
    """Train and test tensors plus what is needed to turn a raw batch into model input.

    ``train_x``/``test_x`` hold raw values (uint8 for images); :meth:`prepare` scales them by
    ``scale`` and normalises per channel with ``mean``/``std``. ``natural_clients``, when set,
    lists each natural client's train indices (LEAF writers, speaking roles).

    Inputs and labels may be torch tensors, numpy arrays or (nested) lists of numbers; arrays and
    lists become tensors (float64 inputs as float32). ``labels`` says what ``train_y``/``test_y``
    hold:

    * ``"classes"`` (the default): one class index per sample, whole numbers in
      ``0..num_classes-1`` (an ``(n, 1)`` column is flattened), stored as int64;
    * ``"values"``: real-valued targets (regression), stored as float32 in their own shape;
      ``num_classes`` is then the model's number of outputs and no integer or range check runs.

    Each problem found on construction is one :class:`~fedbug.errors.DataError`: inputs and
    labels of different lengths, labels that are not class indices or lie outside
    ``0..num_classes-1``, NaN or infinite values, train and test samples of different shapes, an
    empty train set, ``num_classes < 1``. The checks are vectorised and run once per data set.
    """

    name: str
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int
    scale: float = 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    source: str = ""
    natural_clients: list[Tensor] | None = None
    natural_test_clients: list[Tensor] | None = None
    inputs: Literal["image", "vector", "tokens"] = "image"
    augmentation: str = "none"
    meta: dict[str, Any] = field(default_factory=dict)
    labels: Literal["classes", "values"] = "classes"
    _mean_t: Tensor = field(init=False, repr=False)  # set by __post_init__
    _std_t: Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        name = self.name
        if self.labels not in ("classes", "values"):
            raise DataError(
                f"data set {name!r}: labels={self.labels!r}; use labels='classes' (class "
                "indices) or labels='values' (real-valued targets)"
            )
        self.num_classes = _check_num_classes(self.num_classes, name, self.labels)
        self.train_x = _inputs_tensor(self.train_x, f"data set {name!r}: train inputs")
        self.test_x = _inputs_tensor(self.test_x, f"data set {name!r}: test inputs")
        self.train_y = _labels_tensor(self.train_y, f"data set {name!r}: train labels")
        self.test_y = _labels_tensor(self.test_y, f"data set {name!r}: test labels")
        for split, x, y in (
            ("train", self.train_x, self.train_y),
            ("test", self.test_x, self.test_y),
        ):
            if len(x) != len(y):
                raise DataError(
                    f"data set {name!r}: {split} set has {len(x)} inputs but {len(y)} labels; "
                    f"give one label per input ({split}_x and {split}_y of the same length)"
                )
        if len(self.train_x) == 0:
            raise DataError(
                f"data set {name!r}: the train set is empty; give at least one train sample"
            )
        sample = tuple(self.train_x.shape[1:])
        if len(self.test_x) == 0:
            self.test_x = self.test_x.reshape(0, *sample)
        elif tuple(self.test_x.shape[1:]) != sample:
            raise DataError(
                f"data set {name!r}: train samples have shape {_shape(sample)} but test samples "
                f"{_shape(self.test_x.shape[1:])}; give both splits the same per-sample shape "
                f"(e.g. test_x.reshape(len(test_x), {', '.join(map(str, sample)) or '1'}))"
            )
        if self.labels == "classes":
            self.train_y = _class_labels(
                self.train_y, f"data set {name!r}: train", self.num_classes
            )
            self.test_y = _class_labels(self.test_y, f"data set {name!r}: test", self.num_classes)
        else:
            for split in ("train", "test"):
                y = getattr(self, f"{split}_y")
                if not y.is_floating_point() or y.dtype == torch.float64:
                    y = y.to(torch.float32)
                _check_finite(y, f"data set {name!r}: {split} labels")
                setattr(self, f"{split}_y", y)
        _check_finite(self.train_x, f"data set {name!r}: train inputs")
        _check_finite(self.test_x, f"data set {name!r}: test inputs")
        self._check_normalisation()
        shape = (1, -1) + (1,) * (self.train_x.dim() - 2)
        self._mean_t = torch.tensor(self.mean, dtype=torch.float32).view(shape)
        self._std_t = torch.tensor(self.std, dtype=torch.float32).view(shape)

    def _check_normalisation(self) -> None:
        """Refuse a ``scale``, ``mean`` or ``std`` that would make :meth:`prepare` divide by
        zero, give NaN or fail to broadcast (else every run "diverges" in round 1)."""
        name = self.name
        try:
            scale = float(self.scale)
            mean = tuple(float(v) for v in self.mean)
            std = tuple(float(v) for v in self.std)
        except (TypeError, ValueError):
            raise DataError(
                f"data set {name!r}: scale={self.scale!r}, mean={self.mean!r}, std={self.std!r}; "
                "give scale as a number and mean, std as tuples of numbers (one, or one per "
                "channel)"
            ) from None
        if not (math.isfinite(scale) and scale > 0):
            raise DataError(
                f"data set {name!r}: scale={scale}; inputs are divided by it, so give a positive "
                "number (255 for 0..255 bytes, 1 for inputs already scaled)"
            )
        channels = self.train_x.shape[1] if self.train_x.dim() >= 2 else 1
        for key, values in (("mean", mean), ("std", std)):
            if len(values) not in (1, channels):
                raise DataError(
                    f"data set {name!r}: {key}={values} has {len(values)} value(s) but the "
                    f"samples have {channels} channel(s) (shape {_shape(self.input_shape)}); give "
                    f"one value, or one per channel"
                )
            if not all(math.isfinite(v) for v in values):
                raise DataError(
                    f"data set {name!r}: {key}={values} holds a NaN or infinite value; give "
                    "finite numbers"
                )
        if any(v <= 0 for v in std):
            raise DataError(
                f"data set {name!r}: std={std}; inputs are divided by it, so give positive "
                "values (1.0 leaves a channel as it is)"
            )
        self.scale, self.mean, self.std = scale, mean, std

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def client_data(self, idx: Tensor) -> ClientData:
        """The training samples and labels at ``idx`` (a client's), read as
        :func:`~fedbug.core.device.take_rows` reads rows."""
        return ClientData(take_rows(self.train_x, idx), take_rows(self.train_y, idx))

    def prepare(self, x: Tensor) -> Tensor:
        """Raw batch -> model input: normalised float32, or token ids (int64) as they are."""
        if self.inputs == "tokens":
            return x.long()
        x = x.to(torch.float32)
        if self.scale != 1.0:
            x = x / self.scale
        return (x - from_host(self._mean_t, x.device)) / from_host(self._std_t, x.device)

    @classmethod
    def from_clients(
        cls,
        name: str,
        clients: Sequence[Any],
        test: Any = None,
        num_classes: int | None = None,
        **kwargs: Any,
    ) -> FederatedDataset:
        """A data set from a user's own split over clients, for ``partition: natural``.

        ``clients`` holds one entry per client: an ``(x, y)`` pair of tensors / numpy arrays /
        lists, or a map-style ``torch.utils.data.Dataset`` whose items are ``(x, y)``. The
        clients' samples are concatenated in order and ``natural_clients[i]`` is client ``i``'s
        index range. ``test`` is one ``(x, y)`` tuple (or Dataset) for a global test set, or a
        list with one entry per client (then ``natural_test_clients`` is set too and the global
        test set is their concatenation; a client may have no test samples). ``num_classes``
        defaults to the largest label + 1. ``scale`` defaults to 255 for uint8 inputs and 1
        otherwise; other keyword arguments go to the constructor (``mean``, ``std``, ``labels``,
        ``inputs``...).
        """
        pairs = _client_pairs(name, clients)
        train_x, train_y, parts = _concat(pairs, f"data set {name!r}", "client")
        test_x, test_y, test_parts = _test_sets(name, test, len(clients))
        num_classes = _fill_defaults(name, train_x, [train_y, test_y], num_classes, kwargs)
        return cls(
            name,
            train_x,
            train_y,
            test_x,
            test_y,
            num_classes,
            natural_clients=parts,
            natural_test_clients=test_parts,
            **kwargs,
        )

    @classmethod
    def from_huggingface(
        cls,
        name: str,
        train: Any,
        test: Any,
        x: str | list[str],
        y: str,
        num_classes: int | None = None,
        **kwargs: Any,
    ) -> FederatedDataset:
        """A data set from Hugging Face ``datasets.Dataset`` splits, read by column name.

        ``x`` names the input column, or several columns stacked as features along the last
        dimension (scalar columns become one feature each); ``y`` the label column.
        ``num_classes`` defaults to a ``ClassLabel`` column's class count, else the largest
        label + 1. ``scale`` defaults to 255 for uint8 inputs and 1 otherwise; other keyword
        arguments go to the constructor. Needs ``pip install 'fedbug[hf]'``.
        """
        datasets = _import_datasets()
        columns = [x] if isinstance(x, str) else list(x)
        if not columns:
            raise DataError(f"data set {name!r}: x names no column; give one or more columns")
        train_x, train_y = _hf_split(datasets, name, "train", train, columns, y)
        test_x, test_y = _hf_split(datasets, name, "test", test, columns, y)
        if num_classes is None:
            num_classes = _class_label_count(datasets, train, y, kwargs)
        num_classes = _fill_defaults(name, train_x, [train_y, test_y], num_classes, kwargs)
        return cls(name, train_x, train_y, test_x, test_y, num_classes, **kwargs)


def _client_pairs(name: str, clients: Any) -> list[tuple[Tensor, Tensor]]:
    """Each client's (x, y) tensors; clients that are not a list of entries, none, or one
    without samples are a DataError."""
    if isinstance(clients, (Dataset, str, bytes)) or not isinstance(clients, Sequence):
        raise DataError(
            f"data set {name!r}: clients must be a list with one (x, y) pair or Dataset per "
            f"client, not a {type(clients).__name__}"
        )
    if len(clients) == 0:
        raise DataError(f"data set {name!r}: clients is empty; give at least one client")
    pairs = [_pair(c, f"data set {name!r}: client {i}") for i, c in enumerate(clients)]
    for i, (x, _) in enumerate(pairs):
        if len(x) == 0:
            raise DataError(
                f"data set {name!r}: client {i} has no samples; every client needs at "
                "least one train sample (drop it from clients)"
            )
    return pairs


def _test_sets(
    name: str, test: Any, num_clients: int
) -> tuple[Tensor, Tensor, list[Tensor] | None]:
    """(test inputs, test labels, each client's index range or None) from one global test set
    or one per client (see :meth:`FederatedDataset.from_clients`)."""
    if test is None:
        raise DataError(
            f"data set {name!r}: a test set is needed; pass test=(test_x, test_y) for one "
            "global test set, or test=[...] with one (x, y) pair per client"
        )
    if _per_client(test, num_clients):
        tests = [_pair(t, f"data set {name!r}: test set of client {i}") for i, t in enumerate(test)]
        test_x, test_y, test_parts = _concat(tests, f"data set {name!r}", "test set of client")
        if test_x is None:
            raise DataError(
                f"data set {name!r}: no client has a test sample; give at least one, or "
                "pass one global test set as test=(test_x, test_y)"
            )
        return test_x, test_y, test_parts
    if isinstance(test, list) and len(test) != 2 and _entries(test):
        raise DataError(
            f"data set {name!r}: test lists {len(test)} test sets but there are "
            f"{num_clients} clients; give one per client (empty for a client without test "
            "samples), or one global test set as test=(test_x, test_y)"
        )
    test_x, test_y = _pair(test, f"data set {name!r}: test set")
    if len(test_x) == 0:
        raise DataError(f"data set {name!r}: the test set is empty; give test samples")
    return test_x, test_y, None


def _fill_defaults(
    name: str, train_x: Tensor, ys: list[Tensor], num_classes: int | None, kwargs: dict[str, Any]
) -> int:
    """``num_classes``, by default the largest label + 1; and ``kwargs``' ``scale``, by default
    255 for uint8 inputs and 1 otherwise."""
    if num_classes is None:
        num_classes = _default_num_classes(name, ys, kwargs.get("labels", "classes"))
    kwargs.setdefault("scale", 255.0 if train_x.dtype == torch.uint8 else 1.0)
    return num_classes


def _import_datasets() -> Any:
    """Hugging Face's ``datasets`` module; without it, a DataError saying how to install it."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            "reading Hugging Face data sets needs the datasets package: pip install 'fedbug[hf]'"
        ) from None
    return datasets


def _hf_split(
    datasets: Any, name: str, split: str, ds: Any, columns: list[str], y: str
) -> tuple[Tensor, Tensor]:
    """One split's (inputs, labels) read from its columns; a split that is not one
    ``datasets.Dataset``, or lacks a column, is a DataError."""
    if isinstance(ds, datasets.DatasetDict):
        raise DataError(
            f"data set {name!r}: {split} is a DatasetDict with splits {sorted(ds)}; "
            f"pass one split, e.g. {split}=dd[{next(iter(ds), 'train')!r}]"
        )
    if not isinstance(ds, datasets.Dataset):
        raise DataError(
            f"data set {name!r}: {split} must be a datasets.Dataset, not a {type(ds).__name__}"
        )
    missing = [c for c in [*columns, y] if c not in ds.column_names]
    if missing:
        raise DataError(
            f"data set {name!r}: the {split} split has no column(s) {missing}; its "
            f"columns are {ds.column_names}"
        )
    table = ds.with_format("numpy", columns=[*columns, y])[:]
    xs = _stacked_columns(name, split, columns, table)
    return xs, _labels_tensor(table[y], _column(name, split, y))


def _stacked_columns(name: str, split: str, columns: list[str], table: Any) -> Tensor:
    """The input columns as one tensor: a single column as it is, several stacked as features
    along the last dimension (a scalar column one feature)."""
    parts = [_inputs_tensor(table[c], _column(name, split, c)) for c in columns]
    if len(parts) == 1:
        return parts[0]
    parts = [p.unsqueeze(-1) if p.dim() == 1 else p for p in parts]
    lead = {tuple(p.shape[:-1]) for p in parts}
    if len(lead) > 1:
        raise DataError(
            f"data set {name!r}: the {split} columns {columns} cannot be stacked as "
            f"features (shapes {[_shape(p.shape) for p in parts]}); they must agree "
            "in every dimension but the last"
        )
    return torch.cat(parts, dim=-1)


def _column(name: str, split: str, column: str) -> str:
    """How a message names a column of a split."""
    return f"data set {name!r}: {split} column {column!r}"


def _class_label_count(datasets: Any, train: Any, y: str, kwargs: dict[str, Any]) -> int | None:
    """The class count of a ``ClassLabel`` label column (``None`` for another column, or with
    ``labels='values'``)."""
    feature = train.features.get(y)
    if isinstance(feature, datasets.ClassLabel) and kwargs.get("labels") != "values":
        return feature.num_classes
    return None


def _shape(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape)) if len(shape) else "() (a scalar)"


def _tensor(value: Any, what: str, float32: bool = False) -> Tensor:
    """A tensor from a tensor, numpy array, array-like or (nested) list of numbers; with
    ``float32``, float64 values that were not a tensor become float32."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Tensor) for v in value):
        try:
            return torch.stack(list(value))
        except RuntimeError:
            shapes = sorted({_shape(v.shape) for v in value})
            raise DataError(
                f"{what}: the samples have different shapes ({', '.join(shapes[:4])}); give "
                "every sample the same shape (pad or crop them)"
            ) from None
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise DataError(
            f"{what} are not one rectangular array ({e}); give every sample the same shape "
            "(pad or crop them) as a tensor or numpy array"
        ) from None
    if arr.dtype.kind not in "biuf":
        kind = {"U": "text", "S": "bytes", "O": "Python objects", "c": "complex numbers"}
        raise DataError(
            f"{what} hold {kind.get(arr.dtype.kind, str(arr.dtype))}, not numbers; give a "
            "numeric tensor or numpy array (class names map to indices with "
            "np.unique(y, return_inverse=True))"
        )
    if arr.dtype.kind == "u" and arr.dtype.itemsize > 1:
        arr = arr.astype(np.int64)  # torch has uint8 but few operations on wider unsigned ints
    elif not arr.flags.writeable or any(s < 0 for s in arr.strides):
        arr = np.array(arr)  # torch refuses negative strides and warns on read-only arrays
    t = torch.as_tensor(arr)
    return t.to(torch.float32) if float32 and t.dtype == torch.float64 else t


def _inputs_tensor(value: Any, what: str) -> Tensor:
    t = _tensor(value, what, float32=True)
    if t.dim() == 0:
        raise DataError(f"{what} are a single number; give one input per sample (an array)")
    if t.is_complex():
        raise DataError(f"{what} are complex numbers; give real inputs")
    return t


def _labels_tensor(value: Any, what: str) -> Tensor:
    t = _tensor(value, what)
    if t.dim() == 0:
        raise DataError(f"{what} are a single number; give one label per sample (an array)")
    if t.is_complex():
        raise DataError(f"{what} are complex numbers; give real labels")
    return t


def _class_labels(y: Tensor, split: str, num_classes: int | None) -> Tensor:
    """``y`` checked to be one class index per sample (within ``0..num_classes-1`` if given),
    as int64. ``split`` prefixes the messages."""
    if y.dim() == 2 and y.shape[1] == 1:
        y = y.reshape(-1)
    if y.dim() != 1:
        raise DataError(
            f"{split} labels have shape {_shape(y.shape)}; give one class index per sample (for "
            "one-hot labels, y.argmax(1)), or labels='values' for real-valued targets"
        )
    if y.dtype == torch.bool:
        y = y.long()
    if y.is_floating_point():
        _check_finite(y, f"{split} labels")
        fractional = y != torch.round(y)
        if bool(fractional.any()):
            i = int(fractional.nonzero()[0, 0])
            raise DataError(
                f"{split} labels are not whole numbers ({int(fractional.sum())} of them, e.g. "
                f"{float(y[i])} at index {i}); a classification data set needs class indices "
                "0..num_classes-1 (use labels='values' for regression targets)"
            )
    if num_classes is not None and len(y):
        lo, hi = torch.aminmax(y)  # one pass
        if lo < 0 or hi >= num_classes:
            raise DataError(
                f"{split} labels run from {_num(lo)} to {_num(hi)}, outside 0..{num_classes - 1} "
                f"(num_classes={num_classes}); renumber the classes from 0, or raise num_classes"
            )
    return y.long()


def _num(v: Tensor) -> int | float:
    return v.item() if v.is_floating_point() and v != torch.round(v) else int(v)


def _check_finite(t: Tensor, what: str) -> None:
    """One DataError if a float tensor holds NaN or infinite values (the common all-finite
    case answered by a sum: :func:`~fedbug.core.finite.all_finite`)."""
    if all_finite(t):
        return
    flat = t.reshape(len(t), -1)
    rows = max(1, _FINITE_BLOCK // max(1, flat.shape[1]))
    bad = torch.cat([(~torch.isfinite(b)).sum(1) for b in flat.split(rows)])
    count = int(bad.sum())
    samples = bad.nonzero().reshape(-1)
    nan = sum(int(torch.isnan(b).sum()) for b in flat.split(rows))
    var = "y" if "labels" in what else "x"
    raise DataError(
        f"{what} hold {count} non-finite value(s) ({nan} NaN, {count - nan} infinite) in "
        f"{len(samples)} sample(s), the first at index {int(samples[0])}; drop or fill those "
        f"samples (keep = np.isfinite({var}).reshape(len({var}), -1).all(1) marks the good ones)"
    )


def _check_num_classes(num_classes: Any, name: str, labels: str) -> int:
    what = "number of classes" if labels == "classes" else "number of model outputs"
    if isinstance(num_classes, (bool, np.bool_)):  # an int to Python, but never a count
        raise DataError(
            f"data set {name!r}: num_classes={num_classes!r} is a boolean; give the {what} as "
            "an int"
        )
    try:
        n = operator.index(num_classes)
    except TypeError:
        raise DataError(
            f"data set {name!r}: num_classes={num_classes!r} is not a whole number; give the "
            f"{what} as an int"
        ) from None
    if n < 1:
        raise DataError(f"data set {name!r}: num_classes={n}; give the {what} (at least 1)")
    return n


def _pair(entry: Any, what: str) -> tuple[Tensor, Tensor]:
    """(x, y) tensors from an ``(x, y)`` pair or a map-style Dataset of ``(x, y)`` items."""
    if isinstance(entry, TensorDataset) and len(entry.tensors) == 2:
        x, y = entry.tensors
    elif isinstance(entry, Dataset):
        try:
            n = len(entry)  # type: ignore[arg-type]
        except TypeError:
            raise DataError(
                f"{what} is a {type(entry).__name__} without a length; give a map-style "
                "Dataset (with __len__ and __getitem__) or an (x, y) pair"
            ) from None
        xs, ys = [], []
        for i in range(n):
            item = entry[i]
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise DataError(
                    f"{what}: item {i} is a {type(item).__name__}, not an (x, y) pair; make the "
                    "Dataset return (input, label)"
                )
            xs.append(_tensor(item[0], f"{what}: input of item {i}", float32=True))
            ys.append(_tensor(item[1], f"{what}: label of item {i}"))
        if n == 0:
            return torch.zeros(0), torch.zeros(0, dtype=torch.long)
        x = _tensor(xs, f"{what}: inputs")
        y = _tensor(ys, f"{what}: labels")
    elif isinstance(entry, (tuple, list)) and len(entry) == 2:
        x, y = entry
    else:
        raise DataError(
            f"{what} is a {type(entry).__name__}; give an (x, y) pair or a torch Dataset of "
            "(x, y) items"
        )
    x = _inputs_tensor(x, f"{what}: inputs")
    y = _labels_tensor(y, f"{what}: labels")
    if len(x) != len(y):
        raise DataError(f"{what} has {len(x)} inputs but {len(y)} labels; give one label per input")
    return x, y


def _per_client(test: Any, n: int) -> bool:
    """Whether ``test`` lists one test set per client (rather than being one (x, y) tuple or
    Dataset): a list with one entry per client, each a Dataset or a pair."""
    return isinstance(test, list) and len(test) == n and _entries(test)


def _entries(items: list[Any]) -> bool:
    """Whether every item is a Dataset or a pair (a list of per-client entries)."""
    return all(
        isinstance(t, Dataset) or (isinstance(t, (tuple, list)) and len(t) == 2) for t in items
    )


def _concat(
    pairs: list[tuple[Tensor, Tensor]], prefix: str, noun: str
) -> tuple[Any, Any, list[Tensor]]:
    """The pairs' samples concatenated (``None`` if none has any) and each pair's index range."""
    sizes = [len(x) for x, _ in pairs]
    kept = [(i, x, y) for i, (x, y) in enumerate(pairs) if len(x)]
    starts = np.cumsum([0, *sizes])
    ranges = [torch.arange(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]
    if not kept:
        return None, None, ranges
    first, x0, _ = kept[0]
    for i, x, _ in kept[1:]:
        if x.shape[1:] != x0.shape[1:]:
            raise DataError(
                f"{prefix}: {noun} {i} has samples of shape {_shape(x.shape[1:])} but {noun} "
                f"{first} has {_shape(x0.shape[1:])}; give every client the same per-sample shape"
            )
    return torch.cat([x for _, x, _ in kept]), torch.cat([y for _, _, y in kept]), ranges


def _default_num_classes(name: str, ys: Sequence[Tensor | None], labels: str) -> int:
    if labels == "values":
        raise DataError(
            f"data set {name!r}: with labels='values' give num_classes= (the model's number of "
            "outputs)"
        )
    checked = [
        (split, _class_labels(y, f"data set {name!r}: {split}", None))
        for split, y in zip(("train", "test"), ys)
        if y is not None and len(y)
    ]
    n = max(1, max(int(y.max()) for _, y in checked) + 1)
    for split, y in checked:  # negative labels: the range error, not a puzzling num_classes
        _class_labels(y, f"data set {name!r}: {split}", n)
    return n


@dataclass(frozen=True)
class DataShape:
    """What one sample of a data set looks like, known without loading it: the input's shape
    (``FederatedDataset.input_shape``), the number of classes and the input kind
    (``FederatedDataset.inputs``), as the loaded data set gives them."""

    input_shape: tuple[int, ...]
    num_classes: int
    inputs: Literal["image", "vector", "tokens"] = "image"


@dataclass(frozen=True)
class DatasetSpec:
    """How to find and load one data set: ``load(data_dir)`` and ``locate(data_dir)``.

    ``locate`` returns where the files were found (or ``None``) without loading them, and
    ``searched`` the places it looks, for ``fedbug data`` and for the missing-data message.
    ``shape`` is what its samples look like (a :class:`DataShape`; for a generated data set
    one may be a function of its ``dataset_options``), for ``fedbug cost``, which loads no data;
    None: not declared (a user's own data set may leave it out, and ``fedbug cost`` refuses it).
    """

    name: str
    description: str
    load: Callable[[Path | None], FederatedDataset]
    locate: Callable[[Path | None], str | None]
    searched: Callable[[Path | None], list[str]]
    how_to_get: str
    generate: Callable[..., FederatedDataset] | None = None  # a data set built from options
    shape: DataShape | Callable[..., DataShape] | None = None

    def shape_of(self, options: dict[str, Any] | None = None) -> DataShape | None:
        """The declared :class:`DataShape` under ``options`` (``dataset_options``), or None."""
        if self.shape is None or isinstance(self.shape, DataShape):
            return self.shape
        return self.shape(**(options or {}))


DATASETS: Registry[DatasetSpec] = Registry("dataset")
