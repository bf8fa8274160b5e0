"""`--dask local:N` runs over TLS (a temporary security context), and a party ships key material
only to a scheduler reached over TLS unless --dask-insecure (issue 22, Build 6)."""
import subprocess
import sys
from pathlib import Path

import pytest
from phe import PaillierPublicKey
from support import KEY_BITS

from crypto.cluster import check_dask_ca
from crypto.keys import generate_keypair
from crypto.paillier import Encryptor
from datasets.errors import InputError

distributed = pytest.importorskip("distributed")
from distributed.security import Security  # noqa: E402

from crypto.dask_executor import DaskExecutor  # noqa: E402

pytestmark = pytest.mark.slow      # Dask clusters of real worker processes


@pytest.fixture
def key_holder():
    pk, sk = generate_keypair(KEY_BITS)
    return Encryptor(pk, sk, "fast")


def test_a_local_cluster_speaks_tls_and_takes_the_key(key_holder):
    ex = DaskExecutor("local:2", name="active:bank")
    try:
        assert ex.client.scheduler.address.startswith("tls://") and ex.scheduler_tls
        assert all(a.startswith("tls://") for a in ex.addresses)
        ex.share("encryptor", key_holder, {"kind": "encryptor", "state": key_holder.state()})
        assert ex.holds("encryptor", key_holder)
    finally:
        ex.close()


def test_no_key_material_to_a_scheduler_reached_without_tls(key_holder):
    ex = DaskExecutor("local:1", name="active:bank", security=Security())      # a plain tcp:// cluster
    try:
        assert ex.client.scheduler.address.startswith("tcp://")
        with pytest.raises(InputError, match="refusing to send key material .* without TLS.*--dask-insecure"):
            ex.share("encryptor", key_holder, {"kind": "encryptor", "state": key_holder.state()})
        public = Encryptor(PaillierPublicKey(int(key_holder.n)), None, "fast", _hs=key_holder.hs)
        ex.share("pub", public, {"kind": "encryptor", "state": public.state()})      # no private key: fine
    finally:
        ex.close()
    ex = DaskExecutor("local:1", name="active:bank", security=Security(), insecure=True)     # --dask-insecure
    try:
        ex.share("encryptor", key_holder, {"kind": "encryptor", "state": key_holder.state()})
        assert ex.holds("encryptor", key_holder)
    finally:
        ex.close()


def test_a_dask_ca_equal_to_the_federation_ca_is_refused(tmp_path):
    """Issue 31 (finding 7): Dask accepts any certificate its CA signed, and the docs allowed the
    federation's CA for a party's cluster: any federation member reaching the scheduler (a worker
    with its federation certificate) ran code beside the private key. Refused before connecting."""
    root = Path(__file__).resolve().parents[2]

    def vfl(*args):
        return subprocess.run([sys.executable, "-m", "cli", *map(str, args)], cwd=root, capture_output=True,
                              text=True, timeout=120)
    assert vfl("certs", "--out", tmp_path / "fed", "--party", "bank", "--party", "telco").returncode == 0
    assert vfl("certs", "--out", tmp_path / "own", "--party", "telco").returncode == 0
    fed_ca = (tmp_path / "fed" / "ca.pem").read_bytes()
    r = vfl("party", "passive", "--name", "telco", "--data", tmp_path / "telco.csv", "--model-dir", tmp_path / "m",
            "--tls-dir", tmp_path / "fed", "--allow-client", "bank", "--dask-scheduler", "tls://127.0.0.1:9",
            "--dask-tls-dir", tmp_path / "fed")
    assert r.returncode != 0 and "rule 'own Dask CA'" in r.stderr, r.stderr
    bundle = tmp_path / "bundle"        # the federation CA hidden in a bundle with the cluster's own
    bundle.mkdir()
    (bundle / "ca.pem").write_bytes((tmp_path / "own" / "ca.pem").read_bytes() + fed_ca)
    with pytest.raises(InputError, match="rule 'own Dask CA'"):
        check_dask_ca(bundle, fed_ca)
    check_dask_ca(tmp_path / "own", fed_ca)         # a CA of its own: fine
