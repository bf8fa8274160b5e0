"""The toolkit's error vocabulary, shared by every floor.

Every problem caused by the user's input (a file, a column, a party, a
hyperparameter) is raised as :class:`InputError` with a message that names the
culprit, so the CLI can print it without a traceback.

This module imports nothing and sits on the lowest floor: ``crypto``,
``protocols`` and ``datasets`` raise these types, and so does the learner core
in ``vfl/``, which may import none of ``crypto``/``protocols``. It lives in
``datasets`` because that is the one bottom package the learner core may
import (see docs/architecture.md); ``vfl.core.errors`` re-exports it for users.
"""


class VFLError(Exception):
    """Base class of the toolkit's own errors."""


class InputError(VFLError, ValueError):
    """Bad input from the user: a file, a column, a label, a hyperparameter."""


class ProtocolError(VFLError):
    """A peer sent something the protocol does not allow (bad frame, wrong type, wrong shape)."""


class PeerError(VFLError):
    """A peer failed or did not answer in time."""


class WriteError(InputError):
    """A file could not be written (full disk, read-only directory, ...): names the file.

    Raised by the atomic writer (:mod:`datasets.files`); the previous content of the file, if
    any, is intact and no temporary file is left behind."""

    def __init__(self, message: str, path=None, errno: int | None = None):
        super().__init__(message)
        self.path, self.errno = path, errno
