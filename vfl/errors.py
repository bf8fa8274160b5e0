"""Error types shared by every package of the toolkit.

Every problem caused by the user's input (a file, a column, a party, a
hyperparameter) is raised as :class:`InputError` with a message that names the
culprit, so the CLI can print it without a traceback.
"""


class VFLError(Exception):
    """Base class of the toolkit's own errors."""


class InputError(VFLError, ValueError):
    """Bad input from the user: a file, a column, a label, a hyperparameter."""


class ProtocolError(VFLError):
    """A peer sent something the protocol does not allow (bad frame, wrong type, wrong shape)."""


class PeerError(VFLError):
    """A peer failed or did not answer in time."""
