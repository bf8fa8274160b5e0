"""Choosing a party's cluster executor without importing the cluster engine until asked.

:func:`dask_executor` is what the command line, the network functions and the Python API call;
``distributed`` (the optional extra ``[dask]``) is imported only then, so the default paths
(local worker processes) never load it.
"""
from __future__ import annotations

import re
import ssl
from pathlib import Path

from datasets.errors import InputError

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def _ders(pem: bytes) -> set[bytes]:
    return {ssl.PEM_cert_to_DER_cert(c.decode("ascii")) for c in _PEM.findall(pem)}


def check_dask_ca(tls_dir, federation_ca_pem: bytes | None) -> None:
    """Refuse a Dask cluster whose CA (``tls_dir/ca.pem``) trusts a federation CA certificate (issue
    31, finding 7): Dask accepts any certificate of its CA, so every federation member holding a
    certificate of that CA could join the cluster that holds this party's private key and run code
    there. The cluster needs its own CA (``vfl certs --out DASK_DIR --party NAME``)."""
    if tls_dir is None or not federation_ca_pem:
        return
    ca = Path(tls_dir) / "ca.pem"
    try:
        mine = _ders(ca.read_bytes())
    except (OSError, ValueError) as exc:
        raise InputError(f"--dask-tls-dir {tls_dir}: cannot read {ca}: {exc}") from None
    if mine & _ders(federation_ca_pem):
        raise InputError(f"--dask-tls-dir {tls_dir}: rule 'own Dask CA': its ca.pem is the federation's CA "
                         "(--tls-dir): "
                         "any federation member's certificate would be accepted by the Dask cluster that holds "
                         "this party's keys; issue the cluster's certificates from a CA of its own (vfl certs "
                         "--out DIR --party NAME)")


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
