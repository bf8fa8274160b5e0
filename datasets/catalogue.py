"""The catalogue of named data sets: the active party's file and the passive parties' files, sklearn's bundled data
(breast cancer, wine, diabetes) cut vertically, the shared benchmarks (``shared/datasets``) and a9a.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from datasets.errors import InputError

from .csv_tables import PathLike, declared_for, read_party_csv
from .frames import PartyFrame, _show, validate_party_frame
from .libsvm import parse_libsvm
from .loaders import read_party_table
from .split import _check_int, party_names, vertical_split


def load_active_passive(
    active: PathLike,
    passives: list[PathLike],
    id_col: str = "id",
    label_col: str = "y",
    allow_text_label: bool = False,
    categorical=None,
    weight_col: str | None = None,
) -> list[PartyFrame]:
    """Read the active party's file (ids, label, features) and the passive parties' files (ids,
    features): CSV or Parquet (a file or a directory of files, see :func:`read_party_table`).

    Returns ``[active, passive1, passive2, ...]`` (the parties' names, as :func:`party_names`
    gives them). The label must be in the active party's file and in no passive party's file;
    every passive party's file must have at least one feature column. ``weight_col``: the
    active party's column of sample weights (checked as weights, not as a feature).
    """
    if isinstance(passives, (str, os.PathLike)):
        passives = [passives]
    passives = list(passives)
    if not passives:
        raise InputError("load_active_passive needs at least one passive party's file")
    if label_col is None:
        raise InputError("load_active_passive needs the name of the active party's label column")
    names = party_names(1 + len(passives))
    first = read_party_table(active, names[0], id_col, label_col, allow_text_label=allow_text_label,
                             categorical=categorical, weight_col=weight_col)
    parties = [first]
    for name, path in zip(names[1:], passives):
        passive = read_party_table(path, name, id_col, None, categorical=categorical)
        if label_col in passive.frame.columns:
            raise InputError(
                f"party {name!r} (file {str(path)!r}) has the label column {label_col!r}; "
                f"labels must only be held by the active party"
            )
        validate_party_frame(passive, require_features=True, categorical=declared_for(categorical, passive))
        parties.append(passive)
    return parties


def load_guest_host(guest_path: PathLike, host_paths: list[PathLike], *args, **kwargs) -> list[PartyFrame]:
    """Deprecated (FATE's words): use :func:`load_active_passive`, which this calls.

    Warns with a :class:`DeprecationWarning`; the parties are named ``active``, ``passive1``, ...
    """
    warnings.warn("load_guest_host is deprecated, use load_active_passive (FATE's guest is the active party, "
                  "its hosts the passive ones)", DeprecationWarning, stacklevel=2)
    return load_active_passive(guest_path, host_paths, *args, **kwargs)


def breast_cancer_parties(n_parties: int = 2, id_col: str = "id", label_col: str = "y") -> list[PartyFrame]:
    """sklearn's bundled breast cancer data (569 rows, 30 features) split among ``n_parties``.

    Ids are the ints 0..568; the label is sklearn's target (1 = benign, 357 rows).
    The 30 features, named like ``mean_radius``, are cut into contiguous chunks
    as evenly as possible; the active party gets the first chunk and the label.
    Parties are named ``active``, ``passive1``, ``passive2``, ...
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

# name -> (the active party's file, the passive parties' files, id column, label column)
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
_GIVE_CREDIT_ACTIVE = [f"x{i}" for i in range(4)]
_GIVE_CREDIT_PASSIVE = [f"x{i}" for i in range(4, 10)]

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
    parties: active, passive1, passive2) or ``a9a`` (= ``load_a9a("train")``).
    Columns keep their original names; ``PartyFrame.id_col`` / ``label_col``
    say which is which. ``give_credit`` is stored unsplit: the active party gets
    ``x0..x3`` and the label, the passive party ``x4..x9``. The parties are named
    ``active``, ``passive1`` (``passive2``: motor), whatever the files are called.
    """
    valid = sorted([*SHARED_DATASETS, "give_credit", "a9a"])
    if name not in valid:
        raise InputError(f"unknown shared dataset {name!r}; choose one of {', '.join(valid)}")
    base = _shared_root(root)
    if name == "a9a":
        return load_a9a("train", root=base)
    if name == "give_credit":
        return _load_give_credit(base)
    active_file, passive_files, id_col, label_col = SHARED_DATASETS[name]
    active_path = _require_file(base / active_file, name)
    passive_paths = [_require_file(base / f, name) for f in passive_files]
    return load_active_passive(active_path, passive_paths, id_col=id_col, label_col=label_col)


def _load_give_credit(base: Path) -> list[PartyFrame]:
    path = _require_file(base / _GIVE_CREDIT_FILE, "give_credit")
    full = read_party_csv(path, "active", "id", "y")
    features = full.feature_names
    expected = _GIVE_CREDIT_ACTIVE + _GIVE_CREDIT_PASSIVE
    if sorted(features) != sorted(expected):
        extra = [c for c in features if c not in expected]
        missing = [c for c in expected if c not in features]
        raise InputError(
            f"file {str(path)!r}: expected feature columns x0..x9; "
            f"missing [{_show(missing)}], unexpected [{_show(extra)}]"
        )
    active = PartyFrame("active", full.frame[["id", "y", *_GIVE_CREDIT_ACTIVE]].copy(), "id", "y", str(path))
    passive = PartyFrame("passive1", full.frame[["id", *_GIVE_CREDIT_PASSIVE]].copy(), "id", None, str(path))
    return [active, passive]


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


def _a9a_frame(ids: np.ndarray, x: np.ndarray, first_feature: int, id_col: str, labels=None, label_col=None):
    names = [f"f{first_feature + j}" for j in range(x.shape[1])]
    frame = pd.DataFrame(x, columns=names)
    if labels is not None:
        frame.insert(0, label_col, labels)
    frame.insert(0, id_col, ids)
    return frame


def load_a9a(split: str = "train", root: PathLike | None = None) -> list[PartyFrame]:
    """The a9a (UCI Adult) benchmark of FedTree as ``[active, passive1]``, dense float32.

    The active party holds a9a features 1..61 (columns ``f1``..``f61``) and the label
    ``y`` (0/1); the passive party holds features 62..123 (``f62``..``f123``). Ids
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
    active = PartyFrame(
        "active", _a9a_frame(ids, x0, 1, id_col, labels, label_col), id_col, label_col, src0
    )
    passive = PartyFrame("passive1", _a9a_frame(ids, x1, A9A_P0_FEATURES + 1, id_col), id_col, None, src1)
    return [active, passive]


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
