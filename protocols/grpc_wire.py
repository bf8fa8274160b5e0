"""The gRPC wire shared by server and client: the service's method names, the chunk and
frame limits, cutting a frame into chunks, and importing the optional ``grpcio``.

One generic gRPC service (no ``.proto`` code generation: raw bytes in, raw
bytes out) with two methods:

* ``/vfl.Party/Exchange`` (stream -> stream): one request frame, sent in
  chunks of at most :data:`CHUNK_BYTES`, answered by one reply frame in
  chunks. A 2048-bit ciphertext vector for 50,000 rows (~25 MB) thus never
  hits gRPC's per-message limit; the frame as a whole is capped by
  ``max_frame_bytes`` on both sides (the sender also announces the size so an
  oversized frame is refused before it is read).
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


def grpc_options(max_frame_bytes: int):
    return [("grpc.max_send_message_length", GRPC_MESSAGE_LIMIT),
            ("grpc.max_receive_message_length", GRPC_MESSAGE_LIMIT)]

