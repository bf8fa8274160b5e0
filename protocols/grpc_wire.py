"""The gRPC wire shared by server and client: the service's method names, the chunk and
frame limits, cutting a frame into chunks, and importing the optional ``grpcio``.

One generic gRPC service (no ``.proto`` code generation: raw bytes in, raw
bytes out) with three methods:

* ``/vfl.Party/Exchange`` (stream -> stream): one request frame, sent in
  chunks of at most :data:`CHUNK_BYTES`, answered by one reply frame in
  chunks. A 2048-bit ciphertext vector for 50,000 rows (~25 MB) thus never
  hits gRPC's per-message limit; the frame as a whole is capped by
  ``max_frame_bytes`` on both sides (the sender also announces the size so an
  oversized frame is refused before it is read).
* ``/vfl.Party/Call`` (unary): the same exchange for a request frame of at most
  :data:`CHUNK_BYTES`, sent as one gRPC message and answered by the reply frame as one message
  (at most the receiver's frame cap, which bounds a reassembled ``Exchange`` reply too). The many
  small requests of online scoring need no streams: no thread to feed a request stream on the
  client, no per-chunk send rounds on the server (measured on loopback: 0.7 ms against 2.0 ms per
  round trip of a small frame). A server without it (an older version) answers UNIMPLEMENTED
  before running anything, and the client uses ``Exchange``.
* ``/vfl.Party/Hello`` (unary): who is there (party name, role, cap), used to
  wait for peers at start-up and to check that the address belongs to the
  party we expect.

``grpcio`` is an optional dependency (``pip install '.[net]'``), imported only
when a network object is created (:func:`require_grpc`).
"""
from __future__ import annotations

from protocols.certs import NET_EXTRA_HINT, MissingDependency

SERVICE = "vfl.Party"
EXCHANGE = f"/{SERVICE}/Exchange"
CALL = f"/{SERVICE}/Call"
HELLO = f"/{SERVICE}/Hello"
CHUNK_BYTES = 1 << 20                     # 1 MiB per gRPC message
GRPC_MESSAGE_LIMIT = 4 << 20              # no single gRPC message may exceed this
DEFAULT_MAX_FRAME_BYTES = 1 << 30         # 1 GiB per protocol frame
DEFAULT_TIMEOUT = 60.0
#: a request stream that sends no chunk for this long is cut off (slowloris)
DEFAULT_READ_TIMEOUT = 20.0


def require_grpc():
    try:
        import grpc
    except ImportError:
        raise MissingDependency(f"network mode needs the 'grpcio' package: {NET_EXTRA_HINT}") from None
    return grpc


def chunks(frame: bytes):
    view = memoryview(frame)
    if not frame:
        yield b""
    for i in range(0, len(frame), CHUNK_BYTES):
        yield bytes(view[i:i + CHUNK_BYTES])


#: the largest gRPC message (a length is a signed 32-bit number): a client whose frame cap is larger
#: takes ``Exchange`` for every call, since a reply that large cannot be one message
MAX_ONE_MESSAGE = (1 << 31) - 1


def grpc_options(max_frame_bytes: int, side: str):
    """The per-message limits of a ``server`` or ``client``: requests (chunks, or a ``Call``'s one
    message) are at most :data:`GRPC_MESSAGE_LIMIT` each way; a ``Call``'s reply is one message,
    sent whatever its size (the server's own cap is on what it receives) and received up to the
    client's frame cap (``max_frame_bytes``: the cap a reassembled reply has anyway)."""
    if side == "server":
        return [("grpc.max_send_message_length", MAX_ONE_MESSAGE),
                ("grpc.max_receive_message_length", GRPC_MESSAGE_LIMIT)]
    frame = max(GRPC_MESSAGE_LIMIT, min(int(max_frame_bytes), MAX_ONE_MESSAGE))
    return [("grpc.max_send_message_length", GRPC_MESSAGE_LIMIT), ("grpc.max_receive_message_length", frame)]

