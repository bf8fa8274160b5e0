"""Data for vertical federated learning: party frames, loaders, synthetic data, splits.

Every problem with the user's data is raised as :class:`vfl.errors.InputError`
naming the file, party and column concerned.
"""

from .frames import PartyFrame, check_binary_labels, describe_party, validate_party_frame
from .loaders import (
    SHARED_DATASETS,
    SHARED_TASKS,
    breast_cancer_parties,
    load_a9a,
    load_guest_host,
    load_shared,
    parse_libsvm,
    read_party_csv,
    BUNDLED,
    load_named,
    shared_datasets_dir,
    sklearn_parties,
)
from .split import join_parties, party_names, train_test_split_parties, vertical_split
from .synthetic import make_synthetic

__all__ = [
    "PartyFrame",
    "validate_party_frame",
    "check_binary_labels",
    "describe_party",
    "read_party_csv",
    "load_guest_host",
    "breast_cancer_parties",
    "shared_datasets_dir",
    "load_shared",
    "load_a9a",
    "parse_libsvm",
    "SHARED_DATASETS",
    "SHARED_TASKS",
    "make_synthetic",
    "train_test_split_parties",
    "vertical_split",
    "party_names",
    "join_parties",
    "sklearn_parties",
    "load_named",
    "BUNDLED",
]
