"""Feature screening against running passive servers (``vfl screen --federation``): the active party's
table read, a gRPC + TLS transport to every passive party, one :func:`parties.screen.screen`."""
from __future__ import annotations

from datasets.errors import InputError
from datasets.loaders import read_party_table
from parties.active import ActiveParty
from parties.screen import ScreenParams, ScreenResult, screen
from protocols.grpc_client import GrpcTransport
from protocols.grpc_wire import DEFAULT_MAX_FRAME_BYTES, DEFAULT_TIMEOUT


def screen_remote(data, id_col: str, label_col: str, name: str, peers: dict[str, str], params: ScreenParams,
                  security, timeout: float = DEFAULT_TIMEOUT, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                  connect_timeout: float | None = None, executor=None, categorical=None) -> tuple[ScreenResult, dict]:
    """Screen against running passive servers (``vfl party passive``, each granting screening in its
    federation entry) over gRPC + TLS; returns the result and the transport's byte counts."""
    if not peers:
        raise InputError("give at least one --peer NAME=HOST:PORT or a federation file")
    if name in peers:
        raise InputError(f"the active party and a passive party are both named {name!r}")
    table = read_party_table(data, name, id_col, label_col, allow_text_label=True, categorical=categorical)
    active = ActiveParty(name, table.frame, id_col, label_col, source=str(data), executor=executor,
                         categorical=categorical)
    transport = GrpcTransport(name, peers, security, timeout=timeout, max_frame_bytes=max_frame_bytes)
    try:
        transport.connect(timeout=connect_timeout if connect_timeout is not None else timeout)
        result = screen(active, transport, list(peers), params)
    finally:
        transport.close()
    return result, {"bytes_sent": transport.bytes_report(), "total_bytes": transport.total_bytes(),
                    "security": security.describe()}
