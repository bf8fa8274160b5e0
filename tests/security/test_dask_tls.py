"""`--dask local:N` runs over TLS (a temporary security context), and a party ships key material
only to a scheduler reached over TLS unless --dask-insecure (issue 22, Build 6)."""
import pytest
from phe import PaillierPublicKey
from support import KEY_BITS

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
