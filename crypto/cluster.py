"""Choosing a party's cluster executor without importing the cluster engine until asked.

:func:`dask_executor` is what the command line, the network functions and the Python API call;
``distributed`` (the optional extra ``[dask]``) is imported only then, so the default paths
(local worker processes) never load it.
"""
from __future__ import annotations

from datasets.errors import InputError


def dask_executor(scheduler: str, name: str, tls_dir=None, insecure: bool = False, n_workers: int | None = None,
                  direct: bool = True):
    """A :class:`crypto.dask_executor.DaskExecutor` for party ``name`` (``scheduler``: ``local:N`` or an
    address, see there)."""
    try:
        from crypto.dask_executor import DaskExecutor
    except ImportError as exc:
        raise InputError(f"a Dask executor needs the optional extra: pip install '.[dask]' ({exc})") from None
    return DaskExecutor(scheduler, name=name, tls_dir=tls_dir, insecure=insecure, n_workers=n_workers,
                        direct=direct)
