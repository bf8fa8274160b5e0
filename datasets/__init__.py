"""Data for vertical federated learning: party frames, loaders, synthetic data, splits.

Every problem with the user's data is raised as :class:`datasets.errors.InputError`
(also importable as ``vfl.core.errors.InputError``) naming the file, party and column
concerned.

The names below are loaded on first use (PEP 562), so that the floors that
only need :mod:`datasets.errors` (``crypto``, ``protocols``, the worker
processes) do not pay for pandas.
"""
import importlib

_EXPORTS = {
    "frames": ["PartyFrame", "PartyData", "validate_party_frame", "check_binary_labels", "describe_party",
               "party_data", "feature_matrix"],
    "csv_tables": ["read_party_csv"],
    "catalogue": ["load_active_passive", "load_guest_host", "breast_cancer_parties", "shared_datasets_dir",
                  "load_shared", "load_a9a", "SHARED_DATASETS", "SHARED_TASKS", "load_named", "BUNDLED",
                  "sklearn_parties"],
    "libsvm": ["parse_libsvm"],
    "loaders": ["read_party_table", "iter_party_batches"],
    "split": ["train_test_split_parties", "vertical_split", "party_names", "join_parties"],
    "synthetic": ["make_synthetic"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'datasets' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
