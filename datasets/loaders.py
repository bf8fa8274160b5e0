"""Reading party data: CSV files, sklearn's breast cancer data, the shared benchmarks, a9a.

Every problem with the input (missing file, unreadable CSV, missing column,
non-numeric feature, malformed LIBSVM line, ...) is raised as
:class:`datasets.errors.InputError` naming the file, party and column.
"""

from __future__ import annotations

import contextlib
import csv
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from pandas.api import types as ptypes

from datasets.errors import InputError
from datasets.ids import INT_ID, canonical_id

from . import parquet
from .frames import PartyFrame, _show, check_feature_column, validate_party_frame
from .split import _check_int, vertical_split

__all__ = [
    "read_party_csv",
    "read_party_table",
    "iter_party_batches",
    "read_party_piece",
    "DEFAULT_BATCH_ROWS",
    "load_guest_host",
    "breast_cancer_parties",
    "shared_datasets_dir",
    "load_shared",
    "load_a9a",
    "SHARED_DATASETS",
    "SHARED_TASKS",
]

PathLike = str | os.PathLike

# A canonical decimal integer id: no sign other than "-", no leading zeros, no spaces.
_INT_ID = INT_ID


def _party_label(name: str | None) -> str:
    return f" (party {name!r})" if name else ""


def _read_header(path: Path, name: str | None) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            header = next(csv.reader(fh), None)
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read {str(path)!r}{_party_label(name)}: not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:
        raise InputError(f"cannot read {str(path)!r}{_party_label(name)}: bad CSV header ({exc})") from None
    except OSError as exc:
        raise InputError(f"cannot read {str(path)!r}{_party_label(name)}: {exc.strerror or exc}") from None
    if header is None or not any(h.strip() for h in header):
        raise InputError(f"file {str(path)!r}{_party_label(name)} is empty (no CSV header)")
    seen, dups = set(), []
    for h in header:
        if h in seen and h not in dups:
            dups.append(h)
        seen.add(h)
    if dups:
        raise InputError(f"file {str(path)!r}{_party_label(name)} has duplicated column names: {_show(dups)}")
    return header


def _check_row_lengths(path: Path, name: str | None, n_columns: int) -> None:
    """Every data row has exactly the header's number of fields: a row with too few (a truncated
    last line) or too many is an error naming the file and the line (blank lines are skipped, as
    the parser does)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            next(reader, None)
            for row in reader:
                if row and len(row) != n_columns:
                    few = len(row) < n_columns
                    raise InputError(
                        f"cannot parse CSV file {str(path)!r}{_party_label(name)}: line {reader.line_num} has "
                        f"{len(row)} field{'s' if len(row) != 1 else ''}: {'fewer' if few else 'more'} fields "
                        f"than the header has columns ({n_columns})"
                        + (" (a truncated row?)" if few else ""))
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read {str(path)!r}{_party_label(name)}: not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:
        raise InputError(f"cannot parse CSV file {str(path)!r}{_party_label(name)}: {exc}") from None
    except OSError as exc:
        raise InputError(f"cannot read {str(path)!r}{_party_label(name)}: {exc.strerror or exc}") from None


def _ids_to_int_if_canonical(series: pd.Series) -> pd.Series:
    """Ids read as text are written canonically (THE id rule, :mod:`datasets.ids`: ``"133.0"``
    is ``"133"``) and become int64 when every one is a canonical decimal integer.

    Ids like ``"007"`` stay strings, so two parties' ids are never silently made equal by a
    numeric conversion the rule does not make.
    """
    if series.isna().any() or not ptypes.is_string_dtype(series.dtype) or len(series) == 0:
        return series
    text = pd.Series([canonical_id(v) for v in series.tolist()], index=series.index, dtype=object,
                     name=series.name)
    if bool(text.str.fullmatch(_INT_ID).all()):
        return text.astype(np.int64)
    return text.astype(series.dtype)


def read_party_csv(path: PathLike, name: str, id_col: str, label_col: str | None = None,
                   allow_text_label: bool = False, categorical=None, weight_col: str | None = None) -> PartyFrame:
    """Read one party's CSV file (header row required) and validate it.

    The id column is read as text and turned into int64 when every id is a
    canonical integer (so ``"007"`` stays a string id). Feature columns must be
    numeric; empty cells are NaN. With ``allow_text_label`` the label may hold
    class names (strings). Raises :class:`InputError` naming the file
    for a missing, unreadable or empty file and for every validation problem.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"file {str(p)!r}{_party_label(name)} does not exist")
    if p.is_dir():
        raise InputError(f"{str(p)!r}{_party_label(name)} is a directory, expected a CSV file")
    header = _read_header(p, name)
    _check_row_lengths(p, name, len(header))
    dtype = {id_col: str} if id_col in header else None
    with _csv_reader_errors(p, name):
        frame = pd.read_csv(p, dtype=dtype, index_col=False, low_memory=False, encoding="utf-8-sig")
    if len(frame) == 0:
        raise InputError(f"file {str(p)!r}{_party_label(name)} has a header but no data rows")
    if id_col in frame.columns:
        frame[id_col] = _ids_to_int_if_canonical(frame[id_col])
    pf = PartyFrame(name=name, frame=frame, id_col=id_col, label_col=label_col, source=str(p))
    validate_party_frame(pf, require_features=False, allow_text_label=allow_text_label,
                         categorical=declared_for(categorical, pf), weight_col=weight_col)
    return pf


def declared_for(categorical, pf: PartyFrame) -> list[str]:
    """The columns of ``pf`` among ``categorical`` names (``COL``, or ``PARTY:COL`` for one party)."""
    out = []
    for c in categorical or ():
        party, sep, col = str(c).partition(":")
        if not sep:
            party, col = pf.name, c
        if party == pf.name and col in pf.feature_names and col not in out:
            out.append(col)
    return out


def _host_names(n_hosts: int) -> list[str]:
    return ["host"] if n_hosts == 1 else [f"host{i}" for i in range(1, n_hosts + 1)]


def load_guest_host(
    guest_path: PathLike,
    host_paths: list[PathLike],
    id_col: str = "id",
    label_col: str = "y",
    allow_text_label: bool = False,
    categorical=None,
    weight_col: str | None = None,
) -> list[PartyFrame]:
    """Read a guest file (ids, label, features) and host files (ids, features): CSV or Parquet
    (a file or a directory of files, see :func:`read_party_table`).

    Returns ``[guest, host]`` for one host, ``[guest, host1, host2, ...]`` for
    several. The label must be in the guest file and in no host file; every
    host file must have at least one feature column. ``weight_col``: the guest's column of
    sample weights (checked as weights, not as a feature).
    """
    if isinstance(host_paths, (str, os.PathLike)):
        host_paths = [host_paths]
    host_paths = list(host_paths)
    if not host_paths:
        raise InputError("load_guest_host needs at least one host file")
    if label_col is None:
        raise InputError("load_guest_host needs the name of the guest's label column")
    guest = read_party_table(guest_path, "guest", id_col, label_col, allow_text_label=allow_text_label,
                             categorical=categorical, weight_col=weight_col)
    parties = [guest]
    for name, path in zip(_host_names(len(host_paths)), host_paths):
        host = read_party_table(path, name, id_col, None, categorical=categorical)
        if label_col in host.frame.columns:
            raise InputError(
                f"party {name!r} (file {str(path)!r}) has the label column {label_col!r}; "
                f"labels must only be held by the active party (guest)"
            )
        validate_party_frame(host, require_features=True, categorical=declared_for(categorical, host))
        parties.append(host)
    return parties


def breast_cancer_parties(n_parties: int = 2, id_col: str = "id", label_col: str = "y") -> list[PartyFrame]:
    """sklearn's bundled breast cancer data (569 rows, 30 features) split among ``n_parties``.

    Ids are the ints 0..568; the label is sklearn's target (1 = benign, 357 rows).
    The 30 features, named like ``mean_radius``, are cut into contiguous chunks
    as evenly as possible; the guest gets the first chunk and the label.
    Parties are named ``guest``, ``host1``, ``host2``, ...
    """
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    names = [str(n).replace(" ", "_") for n in bunch.feature_names]
    return _bundled_parties(bunch.data, bunch.target, names, n_parties, id_col, label_col)


def _bundled_parties(data, target, names, n_parties, id_col, label_col) -> list[PartyFrame]:
    """A scikit-learn bundled dataset as ``n_parties`` vertical parts (ids are row numbers)."""
    n_parties = _check_int(n_parties, "n_parties", 2, len(names))
    if id_col == label_col:
        raise InputError(f"id_col and label_col must differ, both are {id_col!r}")
    if id_col in names or label_col in names:
        raise InputError(f"id_col/label_col ({id_col!r}, {label_col!r}) clash with a feature name")
    df = pd.DataFrame(np.asarray(data, dtype=np.float64), columns=names)
    df.insert(0, label_col, np.asarray(target))
    df.insert(0, id_col, np.arange(len(df), dtype=np.int64))
    return vertical_split(df, id_col, label_col, n_parties)


# --------------------------------------------------------------------------- shared data

# name -> (guest file, host files, id column, label column)
SHARED_DATASETS: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "breast": ("breast_hetero_guest.csv", ("breast_hetero_host.csv",), "id", "y"),
    "default_credit": ("default_credit_hetero_guest.csv", ("default_credit_hetero_host.csv",), "id", "y"),
    "ionosphere": ("ionosphere_scale_hetero_guest.csv", ("ionosphere_scale_hetero_host.csv",), "sid", "label"),
    "vehicle": ("vehicle_scale_hetero_guest.csv", ("vehicle_scale_hetero_host.csv",), "id", "y"),
    "student": ("student_hetero_guest.csv", ("student_hetero_host.csv",), "id", "y"),
    "dvisits": ("dvisits_hetero_guest.csv", ("dvisits_hetero_host.csv",), "id", "doctorco"),
    "motor": (
        "motor_hetero_guest.csv",
        ("motor_hetero_host_1.csv", "motor_hetero_host_2.csv"),
        "idx",
        "motor_speed",
    ),
}
_GIVE_CREDIT_FILE = "give_credit_homo_test.csv"
_GIVE_CREDIT_GUEST = [f"x{i}" for i in range(4)]
_GIVE_CREDIT_HOST = [f"x{i}" for i in range(4, 10)]

# name -> task ("binary", "multiclass", "regression")
SHARED_TASKS: dict[str, str] = {
    "breast": "binary",
    "default_credit": "binary",
    "give_credit": "binary",
    "ionosphere": "binary",
    "vehicle": "multiclass",
    "student": "regression",
    "dvisits": "regression",
    "motor": "regression",
    "a9a": "binary",
}


def shared_datasets_dir() -> Path | None:
    """The shared benchmark directory, or None when it does not exist.

    ``$VFL_SHARED_DATASETS`` if set (and non-empty), else
    ``<repo root>/../shared/datasets`` (repo root = parent of this package).
    """
    env = os.environ.get("VFL_SHARED_DATASETS")
    if env:
        path = Path(env).expanduser()
    else:
        path = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets"
    return path.resolve() if path.is_dir() else None


def _shared_root(root: PathLike | None) -> Path:
    if root is not None:
        path = Path(root)
        if not path.is_dir():
            raise InputError(f"shared datasets directory {str(path)!r} does not exist")
        return path
    path = shared_datasets_dir()
    if path is None:
        default = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets"
        where = os.environ.get("VFL_SHARED_DATASETS") or str(default)
        raise InputError(
            f"shared datasets directory not found: {where!r} "
            f"(set VFL_SHARED_DATASETS to the directory holding the benchmark files)"
        )
    return path


def _require_file(path: Path, dataset: str) -> Path:
    if not path.is_file():
        raise InputError(f"shared dataset {dataset!r}: file {str(path)!r} is missing")
    return path


def load_shared(name: str, root: PathLike | None = None) -> list[PartyFrame]:
    """Load one of the shared vertically split benchmark data sets.

    ``name`` is one of ``breast``, ``default_credit``, ``give_credit``,
    ``ionosphere``, ``vehicle``, ``student``, ``dvisits``, ``motor`` (three
    parties: guest, host1, host2) or ``a9a`` (= ``load_a9a("train")``).
    Columns keep their original names; ``PartyFrame.id_col`` / ``label_col``
    say which is which. ``give_credit`` is stored unsplit: the guest gets
    ``x0..x3`` and the label, the host ``x4..x9``.
    """
    valid = sorted([*SHARED_DATASETS, "give_credit", "a9a"])
    if name not in valid:
        raise InputError(f"unknown shared dataset {name!r}; choose one of {', '.join(valid)}")
    base = _shared_root(root)
    if name == "a9a":
        return load_a9a("train", root=base)
    if name == "give_credit":
        return _load_give_credit(base)
    guest_file, host_files, id_col, label_col = SHARED_DATASETS[name]
    guest_path = _require_file(base / guest_file, name)
    host_paths = [_require_file(base / f, name) for f in host_files]
    return load_guest_host(guest_path, host_paths, id_col=id_col, label_col=label_col)


def _load_give_credit(base: Path) -> list[PartyFrame]:
    path = _require_file(base / _GIVE_CREDIT_FILE, "give_credit")
    full = read_party_csv(path, "guest", "id", "y")
    features = full.feature_names
    expected = _GIVE_CREDIT_GUEST + _GIVE_CREDIT_HOST
    if sorted(features) != sorted(expected):
        extra = [c for c in features if c not in expected]
        missing = [c for c in expected if c not in features]
        raise InputError(
            f"file {str(path)!r}: expected feature columns x0..x9; "
            f"missing [{_show(missing)}], unexpected [{_show(extra)}]"
        )
    guest = PartyFrame("guest", full.frame[["id", "y", *_GIVE_CREDIT_GUEST]].copy(), "id", "y", str(path))
    host = PartyFrame("host", full.frame[["id", *_GIVE_CREDIT_HOST]].copy(), "id", None, str(path))
    return [guest, host]


# --------------------------------------------------------------------------- a9a (LIBSVM)

# Checked on the files: a9a_vertical_p0.libsvm uses indices 1..61 (= a9a features
# 1..61); a9a_vertical_p1.libsvm is renumbered locally, 1..62 (= a9a features
# 62..123, local j <-> global 61 + j); a9a_vertical_test.libsvm uses the global
# indices 1..123. Labels are "0" / "+1".
A9A_P0_FEATURES = 61
A9A_P1_FEATURES = 62
A9A_FEATURES = A9A_P0_FEATURES + A9A_P1_FEATURES
_A9A_FILES = {
    "p0": "a9a_vertical_p0.libsvm",
    "p1": "a9a_vertical_p1.libsvm",
    "test": "a9a_vertical_test.libsvm",
}
_LABELS = {"0": 0, "+1": 1, "1": 1, "-1": 0}


def _parse_label(token: str, path: Path, lineno: int) -> int:
    label = _LABELS.get(token)
    if label is not None:
        return label
    try:
        value = float(token)
    except ValueError:
        value = None
    if value in (0.0, -1.0):
        return 0
    if value == 1.0:
        return 1
    raise InputError(f"LIBSVM file {str(path)!r}, line {lineno}: label {token!r} is not one of 0, +1, -1")


def parse_libsvm(path: PathLike, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """Parse a LIBSVM file into ``(labels int64 0/1, dense float32 matrix n x n_features)``.

    Feature ``k`` (1-based) goes to column ``k - 1``; absent entries are 0
    (LIBSVM's sparse convention, not missing values). Labels 0/-1 -> 0, +1 -> 1.
    Trailing blank lines are ignored; any other malformed line raises
    :class:`InputError` naming the file and line.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="ascii")
    except FileNotFoundError:
        raise InputError(f"LIBSVM file {str(p)!r} does not exist") from None
    except UnicodeDecodeError:
        raise InputError(f"LIBSVM file {str(p)!r} is not ASCII text") from None
    except OSError as exc:
        raise InputError(f"cannot read LIBSVM file {str(p)!r}: {exc.strerror or exc}") from None
    lines = text.rstrip().split("\n") if text.strip() else []
    if not lines:
        raise InputError(f"LIBSVM file {str(p)!r} is empty")
    labels = np.empty(len(lines), dtype=np.int64)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for i, line in enumerate(lines):
        parts = line.split()
        if not parts:
            raise InputError(f"LIBSVM file {str(p)!r}, line {i + 1}: blank line")
        labels[i] = _parse_label(parts[0], p, i + 1)
        prev = 0
        seen: set[int] = set()
        for tok in parts[1:]:
            idx_s, sep, val_s = tok.partition(":")
            try:
                idx = int(idx_s)
                val = float(val_s)
            except ValueError:
                idx = val = None
            if not sep or idx is None:
                raise InputError(f"LIBSVM file {str(p)!r}, line {i + 1}: bad token {tok!r} (expected index:value)")
            if not 1 <= idx <= n_features:
                raise InputError(
                    f"LIBSVM file {str(p)!r}, line {i + 1}: feature index {idx} outside 1..{n_features}"
                )
            if idx <= prev and idx in seen:
                raise InputError(f"LIBSVM file {str(p)!r}, line {i + 1}: feature index {idx} repeated")
            seen.add(idx)
            if not np.isfinite(val):
                raise InputError(f"LIBSVM file {str(p)!r}, line {i + 1}: feature {idx} has value {val_s!r}")
            prev = idx
            rows.append(i)
            cols.append(idx - 1)
            vals.append(val)
    dense = np.zeros((len(lines), n_features), dtype=np.float32)
    dense[np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)] = np.asarray(vals, dtype=np.float32)
    return labels, dense


def _a9a_frame(ids: np.ndarray, x: np.ndarray, first_feature: int, id_col: str, labels=None, label_col=None):
    names = [f"f{first_feature + j}" for j in range(x.shape[1])]
    frame = pd.DataFrame(x, columns=names)
    if labels is not None:
        frame.insert(0, label_col, labels)
    frame.insert(0, id_col, ids)
    return frame


def load_a9a(split: str = "train", root: PathLike | None = None) -> list[PartyFrame]:
    """The a9a (UCI Adult) benchmark of FedTree as ``[guest, host]``, dense float32.

    The guest holds a9a features 1..61 (columns ``f1``..``f61``) and the label
    ``y`` (0/1); the host holds features 62..123 (``f62``..``f123``). Ids
    (column ``id``) are the row numbers 0..n-1. ``split="train"`` reads the two
    vertical part files (32561 rows), ``split="test"`` the single test file
    (16281 rows), whose columns are split the same way.
    """
    if split not in ("train", "test"):
        raise InputError(f"a9a split must be 'train' or 'test', got {split!r}")
    base = _shared_root(root) / "a9a"
    id_col, label_col = "id", "y"
    if split == "train":
        p0 = _require_file(base / _A9A_FILES["p0"], "a9a")
        p1 = _require_file(base / _A9A_FILES["p1"], "a9a")
        y0, x0 = parse_libsvm(p0, A9A_P0_FEATURES)
        y1, x1 = parse_libsvm(p1, A9A_P1_FEATURES)
        if len(y0) != len(y1):
            raise InputError(f"a9a: {str(p0)!r} has {len(y0)} rows but {str(p1)!r} has {len(y1)}")
        mismatch = np.flatnonzero(y0 != y1)
        if len(mismatch):
            raise InputError(
                f"a9a: the labels of {str(p0)!r} and {str(p1)!r} differ on {len(mismatch)} rows "
                f"(lines {_show((mismatch + 1).tolist())})"
            )
        labels, src0, src1 = y0, str(p0), str(p1)
    else:
        pt = _require_file(base / _A9A_FILES["test"], "a9a")
        labels, x = parse_libsvm(pt, A9A_FEATURES)
        x0, x1 = x[:, :A9A_P0_FEATURES], x[:, A9A_P0_FEATURES:]
        src0 = src1 = str(pt)
    ids = np.arange(len(labels), dtype=np.int64)
    guest = PartyFrame(
        "guest", _a9a_frame(ids, x0, 1, id_col, labels, label_col), id_col, label_col, src0
    )
    host = PartyFrame("host", _a9a_frame(ids, x1, A9A_P0_FEATURES + 1, id_col), id_col, None, src1)
    return [guest, host]


def sklearn_parties(name: str, n_parties: int = 2, id_col: str = "id", label_col: str = "y") -> list[PartyFrame]:
    """scikit-learn's bundled ``wine`` (3 classes) or ``diabetes`` (regression) split vertically.

    Features are named ``f0, f1, ...`` and split into ``n_parties`` contiguous chunks;
    ids are row numbers. No network is needed.
    """
    from sklearn.datasets import load_diabetes, load_wine

    loaders = {"wine": load_wine, "diabetes": load_diabetes}
    if name not in loaders:
        raise InputError(f"unknown scikit-learn dataset {name!r}; choose one of {sorted(loaders)}")
    bunch = loaders[name]()
    names = [f"f{i}" for i in range(bunch.data.shape[1])]
    return _bundled_parties(bunch.data, bunch.target, names, n_parties, id_col, label_col)


BUNDLED = ("breast_cancer", "wine", "diabetes")


def load_named(name: str, n_parties: int = 2, id_col: str = "id", label_col: str = "y") -> list[PartyFrame]:
    """A dataset by name: scikit-learn's bundled ``breast_cancer``, ``wine`` or ``diabetes``
    (split into ``n_parties``), or a name of ``../shared/datasets`` (its own split)."""
    if name == "breast_cancer":
        return breast_cancer_parties(n_parties, id_col=id_col, label_col=label_col)
    if name in BUNDLED:
        return sklearn_parties(name, n_parties, id_col=id_col, label_col=label_col)
    return load_shared(name)


# --------------------------------------------------------------------------- any table: CSV or Parquet

DEFAULT_BATCH_ROWS = 100_000


def read_party_table(path: PathLike, name: str, id_col: str, label_col: str | None = None,
                     allow_text_label: bool = False, categorical=None, weight_col: str | None = None) -> PartyFrame:
    """Read one party's table: a CSV file, a Parquet file or a directory of Parquet files.

    Parquet is recognised by content (a directory, or a file starting with ``PAR1``), anything else
    is read as CSV (:func:`read_party_csv`). A Parquet table gets the same validation and the same
    id rule as a CSV file (string ids that are all canonical integers become int64); every error
    is an :class:`InputError` naming the file (for a directory, the file at fault when one is) and
    the column.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"file {str(p)!r}{_party_label(name)} does not exist")
    if not parquet.is_parquet(p):
        return read_party_csv(p, name, id_col, label_col, allow_text_label=allow_text_label,
                              categorical=categorical, weight_col=weight_col)
    schema = _parquet_schema(p, name, id_col, label_col, allow_text_label, _declared_names(categorical, name))
    return _read_parquet_columns(p, schema, name, id_col, label_col, None, allow_text_label, categorical,
                                 weight_col=weight_col)


class DeferredColumns:
    """The feature columns of a Parquet table, read when the party asks for them (after the
    alignment): a driver then never holds its features and the alignment's hash sorts at once.
    :meth:`read_ids` and :meth:`read_column` check what they read as :func:`read_party_table` does.

    It is also a column reader (``shape``, :meth:`column`) for :mod:`vfl.core.binning`: binned and
    fingerprinted one column at a time, the features are never in memory whole."""

    def __init__(self, path: Path, schema, name: str, id_col: str, feature_names: list[str],
                 n_rows: int | None = None):
        self.path, self.schema, self.name, self.id_col = path, schema, name, id_col
        self.feature_names = list(feature_names)
        self.source = str(path)
        self.n_rows = n_rows

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, feature columns)``; the rows are known once the ids were read."""
        if self.n_rows is None:
            raise ValueError("the number of rows is known once the ids were read (read_ids)")
        return self.n_rows, len(self.feature_names)

    def column(self, j: int) -> np.ndarray:
        """Feature ``j`` (:meth:`read_column` of ``feature_names[j]``); its length is checked."""
        col = self.read_column(self.feature_names[j])
        if len(col) != self.shape[0]:
            raise InputError(f"party {self.name!r}: column {self.feature_names[j]!r} of {self.source} has "
                             f"{len(col)} rows, its ids {self.shape[0]}; was the file replaced during training?")
        return col

    def read_ids(self) -> np.ndarray:
        """The id column, normalised as :func:`read_party_table` does (the rows' order)."""
        ids = _read_parquet_columns(self.path, self.schema, self.name, self.id_col, None, [self.id_col],
                                    False).frame[self.id_col].to_numpy()
        self.n_rows = len(ids)
        return ids

    def read_column(self, col: str) -> np.ndarray:
        """One feature column as float64 (missing: NaN), checked; one column in memory at a time."""
        frame = parquet.read_parquet_frame(self.schema, self.name, columns=[col])
        pf = PartyFrame(name=self.name, frame=frame, id_col=self.id_col, label_col=None, source=self.source)
        try:
            return check_feature_column(pf, col)
        except InputError:
            if len(self.schema.files) > 1:    # name the file at fault and its own rows
                _validate_files_one_by_one(self.schema, pf, False, [self.id_col, col])
            raise


def read_party_table_deferred(path: PathLike, name: str, id_col: str, label_col: str | None, keep=(),
                              allow_text_label: bool = False, categorical=None, weight_col: str | None = None):
    """``(PartyFrame of the id, label and ``keep`` columns, DeferredColumns of every other column)``
    of a Parquet table whose feature columns are all numeric; None for a CSV file or a table with
    categorical columns (read those whole with :func:`read_party_table`). Every check the schema
    decides runs now; the feature values are checked when they are read."""
    p = Path(path)
    if not p.exists() or not parquet.is_parquet(p):
        return None
    declared = _declared_names(categorical, name)
    schema = _parquet_schema(p, name, id_col, label_col, allow_text_label, declared)
    head = [c for c in (id_col, label_col, *keep) if c is not None]
    features = [c for c in schema.columns if c not in head]
    if declared & set(features):
        return None
    pf = _read_parquet_columns(p, schema, name, id_col, label_col, head, allow_text_label,
                               weight_col=weight_col)
    return pf, DeferredColumns(p, schema, name, id_col, features, n_rows=len(pf.frame))


def _read_parquet_columns(p: Path, schema, name, id_col, label_col, columns, allow_text_label,
                          categorical=None, weight_col: str | None = None) -> PartyFrame:
    """``columns`` of the table (None: all), ids normalised, validated (the file at fault named)."""
    frame = parquet.read_parquet_frame(schema, name, columns=columns)
    frame[id_col] = _normalise_ids(frame[id_col], _ParquetIds(schema, name, p))
    pf = PartyFrame(name=name, frame=frame, id_col=id_col, label_col=label_col, source=str(p))
    try:
        validate_party_frame(pf, require_features=False, allow_text_label=allow_text_label,
                             categorical=declared_for(categorical, pf), weight_col=weight_col)
    except InputError:
        if len(schema.files) > 1:         # name the file at fault when the problem is within one file
            _validate_files_one_by_one(schema, pf, allow_text_label, columns)
        raise
    return pf


def _declared_names(categorical, party: str) -> set[str]:
    """Column names declared categorical for ``party`` (``COL`` or ``PARTY:COL``)."""
    out = set()
    for c in categorical or ():
        owner, sep, col = str(c).partition(":")
        if not sep:
            out.add(str(c))
        elif owner == party:
            out.add(col)
    return out


def _parquet_schema(p: Path, name, id_col, label_col, allow_text_label, categorical=()):
    schema = parquet.party_schema(p, name)
    parquet.check_party_columns(schema, name, id_col, label_col, allow_text_label, str(p), categorical)
    if schema.n_rows == 0:
        raise InputError(f"file {str(p)!r}{_party_label(name)} has a header but no data rows "
                         f"(its Parquet file(s) hold no rows)")
    return schema


class _ParquetIds:
    """Where ids came from, for the messages of :func:`_normalise_ids`."""

    def __init__(self, schema, name, path):
        self.schema, self.name, self.path = schema, name, path


def _normalise_ids(ids: pd.Series, where: _ParquetIds | None = None) -> pd.Series:
    """Integer ids as int64; text ids as :func:`_ids_to_int_if_canonical` (the CSV rule)."""
    if ptypes.is_integer_dtype(ids.dtype) and not ptypes.is_bool_dtype(ids.dtype):
        if ids.dtype == np.uint64 and len(ids) and int(ids.max()) > np.iinfo(np.int64).max:
            raise InputError(f"file {str(where.path)!r}{_party_label(where.name)}: id column {ids.name!r} holds "
                             f"integers above 2**63 - 1")
        return ids.astype(np.int64)
    return _ids_to_int_if_canonical(ids)


def _validate_files_one_by_one(schema, whole: PartyFrame, allow_text_label: bool, columns=None) -> None:
    """Re-run the validation file by file (only after the whole table failed): raise the first
    file's error, naming that file and its own row numbers."""
    for f in schema.files:
        frame = parquet.read_parquet_piece(f, whole.name, columns=columns)
        frame[whole.id_col] = _normalise_ids(frame[whole.id_col], _ParquetIds(schema, whole.name, f))
        validate_party_frame(PartyFrame(whole.name, frame, whole.id_col, whole.label_col, str(f)),
                             require_features=False, allow_text_label=allow_text_label)


def _csv_reader_errors(p: Path, name: str | None):
    """Translate pandas' CSV errors into :class:`InputError` naming the file (a context manager)."""
    @contextlib.contextmanager
    def translate():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield
            except pd.errors.EmptyDataError:
                raise InputError(f"file {str(p)!r}{_party_label(name)} is empty") from None
            except pd.errors.ParserError as exc:
                msg = str(exc).strip().replace("Error tokenizing data. C error: ", "")
                raise InputError(f"cannot parse CSV file {str(p)!r}{_party_label(name)}: {msg}") from None
            except UnicodeDecodeError as exc:
                raise InputError(f"cannot read {str(p)!r}{_party_label(name)}: not UTF-8 text ({exc.reason})") \
                    from None
            except OSError as exc:
                raise InputError(f"cannot read {str(p)!r}{_party_label(name)}: {exc.strerror or exc}") from None
            except (ValueError, TypeError) as exc:
                raise InputError(f"cannot parse CSV file {str(p)!r}{_party_label(name)}: {exc}") from None
        for w in caught:
            if issubclass(w.category, pd.errors.ParserWarning):
                raise InputError(
                    f"cannot parse CSV file {str(p)!r}{_party_label(name)}: some rows have more fields "
                    f"than the header has columns ({w.message})"
                )
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    return translate()


def _csv_chunks(p: Path, name: str | None, id_col: str, batch_rows: int, usecols=None):
    """``(file, first data row, DataFrame)`` of at most ``batch_rows`` rows, ids as text."""
    with _csv_reader_errors(p, name):
        reader = pd.read_csv(p, dtype={id_col: str}, index_col=False, encoding="utf-8-sig",
                             chunksize=batch_rows, usecols=usecols)
    start = 0
    with reader:
        while True:
            with _csv_reader_errors(p, name):
                try:
                    frame = next(reader)
                except StopIteration:
                    return
            yield str(p), start, frame
            start += len(frame)


def _csv_columns(p: Path, name, id_col, label_col) -> list[str]:
    header = _read_header(p, name)
    where = f"party {name!r} (file {str(p)!r})"
    if id_col not in header:
        raise InputError(f"{where}: id column {id_col!r} not found; columns are [{_show(header, 10)}]")
    if label_col is not None:
        if label_col == id_col:
            raise InputError(f"{where}: the label column and the id column are both {id_col!r}")
        if label_col not in header:
            raise InputError(f"{where}: label column {label_col!r} not found; columns are [{_show(header, 10)}]")
    return header


def iter_party_batches(path: PathLike, name: str, id_col: str, label_col: str | None = None,
                       batch_rows: int = DEFAULT_BATCH_ROWS, allow_text_label: bool = False,
                       categorical=None):
    """The party's table (CSV, Parquet file or directory) as validated :class:`PartyFrame` batches
    of at most ``batch_rows`` rows, in file order, holding one batch in memory at a time.

    The id column is checked on the whole table first (missing and duplicated ids, and the CSV rule
    that decides whether text ids become integers), so the batches hold exactly the ids and values
    :func:`read_party_table` would; only the ids of the whole table are ever in memory together.
    A problem in a batch is reported with the file and the batch's first row.
    """
    batch_rows = _check_int(batch_rows, "batch_rows", 1)
    p = Path(path)
    if not p.exists():
        raise InputError(f"file {str(p)!r}{_party_label(name)} does not exist")
    if parquet.is_parquet(p):
        schema = _parquet_schema(p, name, id_col, label_col, allow_text_label, _declared_names(categorical, name))
        ids = parquet.read_parquet_frame(schema, name, columns=[id_col])[id_col]
        ids = _normalise_ids(ids, _ParquetIds(schema, name, p))
        chunks = ((str(f), start, frame) for f, start, frame in parquet.iter_parquet_frames(schema, name, batch_rows))
    else:
        if p.is_dir():
            raise InputError(f"{str(p)!r}{_party_label(name)} is a directory, expected a CSV file")
        _csv_columns(p, name, id_col, label_col)
        parts = [frame[id_col] for _, _, frame in _csv_chunks(p, name, id_col, max(batch_rows, 65536),
                                                              usecols=[id_col])]
        if not parts or sum(len(x) for x in parts) == 0:
            raise InputError(f"file {str(p)!r}{_party_label(name)} has a header but no data rows")
        ids = _ids_to_int_if_canonical(pd.concat(parts, ignore_index=True))
        chunks = _csv_chunks(p, name, id_col, batch_rows)
    validate_party_frame(PartyFrame(name, ids.to_frame(), id_col, None, str(p)), require_features=False)
    as_int = ids.dtype == np.int64
    del ids
    for source, start, frame in chunks:
        col = frame[id_col]
        if as_int:
            frame[id_col] = col.astype(np.int64) if ptypes.is_integer_dtype(col.dtype) else \
                pd.Series([int(canonical_id(v)) for v in col.tolist()], index=col.index, dtype=np.int64)
        elif ptypes.is_string_dtype(col.dtype):      # text ids as the whole table has them (the id rule)
            frame[id_col] = pd.Series([canonical_id(v) for v in col.tolist()], index=col.index,
                                      dtype=object).astype(col.dtype)
        pf = PartyFrame(name, frame.reset_index(drop=True), id_col, label_col, source)
        try:
            validate_party_frame(pf, require_features=False, allow_text_label=allow_text_label,
                                 categorical=declared_for(categorical, pf))
        except InputError as exc:
            raise InputError(f"{exc} (in the batch of data rows from row {start} of {source!r}; "
                             f"row numbers count from that row)") from None
        yield pf


def read_party_piece(file: PathLike, name: str, id_col: str, label_col: str | None = None,
                     row_group: int | None = None, int_ids: bool | None = None,
                     allow_text_label: bool = False) -> PartyFrame:
    """One Parquet file (or one row group of it) of a party's table as a validated
    :class:`PartyFrame`: what a worker runs on its own piece (see
    :func:`datasets.parquet.parquet_pieces`). The checks that need the whole table (duplicated ids
    across pieces, the text-id rule) are the caller's: ``int_ids`` says whether text ids become
    int64 (the decision :func:`iter_party_batches` takes on the whole id column; None: decide on
    this piece alone)."""
    frame = parquet.read_parquet_piece(file, name, row_group=row_group)
    if id_col in frame.columns:
        ids = frame[id_col]
        if int_ids is None:
            frame[id_col] = _normalise_ids(ids, _ParquetIds(None, name, file))
        elif int_ids and not ids.isna().any():
            try:
                frame[id_col] = ids.astype(np.int64) if ptypes.is_integer_dtype(ids.dtype) else \
                    ids.astype(str).astype(np.int64)
            except (ValueError, TypeError, OverflowError):
                raise InputError(f"file {str(file)!r}{_party_label(name)}: id column {id_col!r} does not hold "
                                 f"integers (int_ids=True)") from None
    pf = PartyFrame(name, frame, id_col, label_col, str(file))
    where = f" (in row group {row_group}; row numbers count from its first row)" if row_group is not None else ""
    try:
        validate_party_frame(pf, require_features=False, allow_text_label=allow_text_label)
    except InputError as exc:
        raise InputError(f"{exc}{where}") from None
    return pf
