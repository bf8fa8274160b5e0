"""The active party's round pipeline: the gradient channel encrypts each round once for every
passive party, as a round observer, before any of them is sent the round; the round's one timing
record holds every stage; the caller's observers see typed records after the party's own."""
import numpy as np
from support import KEY_BITS, small_frames, streamed_gradients

from crypto.paillier import Encryptor
from protocols.serialization import loads
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core.rounds import RoundObserver


def _federation():
    a, b, c = small_frames(160)
    return Federation(ActiveParty("bank", a, n_jobs=1),
                      [PassiveParty("telco", b, n_jobs=1), PassiveParty("shop", c, n_jobs=1)], record=True)


def test_each_round_is_encrypted_once_for_all_passive_parties(monkeypatch):
    batches = []
    real = Encryptor.encrypt_stocked     # the stock's obfuscators first, the rest made on the spot

    def counting(self, plaintexts, *args, **kwargs):
        batches.append(len(plaintexts))
        return real(self, plaintexts, *args, **kwargs)

    monkeypatch.setattr(Encryptor, "encrypt_stocked", counting)
    fed = _federation()
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=3, max_depth=2))
    assert len(batches) == 3                       # one batch per round, not one per passive party
    sent = {}
    for party in ("telco", "shop"):
        for start, values in streamed_gradients(loads(f) for _, r, f in fed.transport.log if r == party):
            sent.setdefault(start.round_idx, {})[party] = values
    assert sorted(sent) == [0, 1, 2]
    for per_party in sent.values():               # both parties got the very same ciphertexts
        assert set(per_party) == {"telco", "shop"} and per_party["telco"] == per_party["shop"]


def test_one_timing_record_per_round_with_every_stage():
    fed = _federation()
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=2, max_depth=2))
    assert len(fed.active.timings) == 2
    for t in fed.active.timings:
        assert {"gradients", "encrypt", "histograms", "histogram", "compress", "decrypt", "split_search",
                "apply_splits", "total", "bytes_sent"} <= set(t)
        assert t["encrypt"] > 0 and t["decrypt"] > 0 and t["histogram"] > 0 and t["bytes_sent"] > 0
        assert t["gradients"] >= t["encrypt"]            # encryption happens in the gradients stage
    crypto = fed.active.crypto_seconds()
    assert crypto["encrypt"] == sum(t["encrypt"] for t in fed.active.timings)


def test_caller_observers_see_records_completed_by_the_party_and_can_stop():
    seen = []

    class Watch(RoundObserver):
        def round_started(self, gradients):
            seen.append(("started", gradients.round_idx))

        def round_finished(self, record):
            seen.append(("finished", record.round_idx, record.timing.bytes_sent, dict(record.history)))
            return record.round_idx == 1

    fed = _federation()
    model = fed.fit(TrainParams(mode="plain", n_estimators=5, max_depth=2), observers=[Watch()])
    assert model.n_rounds == 2
    assert [s[:2] for s in seen] == [("started", 0), ("finished", 0), ("started", 1), ("finished", 1)]
    finished = [s for s in seen if s[0] == "finished"]
    assert all(b is not None and b > 0 for _, _, b, _ in finished)      # bytes filled in before us
    assert all(h["train"]["logloss"] for _, _, _, h in finished)        # metrics too (the monitor)
    assert np.isfinite(finished[-1][3]["train"]["logloss"][-1])
