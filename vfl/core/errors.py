"""The toolkit's error types (defined once, on the bottom floor, in :mod:`datasets.errors`)."""
from datasets.errors import InputError, PeerError, ProtocolError, VFLError

__all__ = ["VFLError", "InputError", "ProtocolError", "PeerError"]
