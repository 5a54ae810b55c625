"""The errors collie raises when communication cannot complete.

Every error raised by a communication call is a CollieError (bad arguments
are plain ValueError/TypeError, raised before anything is sent). Messages name
the group, the operation, its sequence number and the rank(s) at fault, so that
the log of any one rank is enough to see what went wrong.

Vocabulary used across collie:
  rank      a process's index in a group (the world group unless stated)
  peer      another rank this rank exchanges messages with
  tag       an integer that separates streams of messages between two ranks
  sequence  the count of collectives a group has run, the same on every rank
"""

from __future__ import annotations

__all__ = [
    "CollieError",
    "PeerError",
    "CollieTimeout",
    "MismatchError",
    "AuthError",
    "AbortedError",
]


class CollieError(RuntimeError):
    """Base class: a communication call could not complete."""


class PeerError(CollieError):
    """A peer died or closed its connection while this rank depended on it."""

    def __init__(self, message: str, peer: int | None = None):
        super().__init__(message)
        self.peer = peer


class CollieTimeout(CollieError, TimeoutError):
    """A peer did not arrive within the group's timeout."""

    def __init__(self, message: str, peers: tuple[int, ...] = ()):
        super().__init__(message)
        self.peers = peers


class MismatchError(CollieError):
    """Ranks of a group called different collectives, or the same one with a
    different dtype, element count, root, reduce op, algorithm or split.
    ``peer`` is the rank whose call differs from this rank's (None: unknown)."""

    def __init__(self, message: str, peer: int | None = None):
        super().__init__(message)
        self.peer = peer


class AuthError(CollieError):
    """A connection failed the shared-token check (COLLIE_TOKEN / token=)."""


class AbortedError(CollieError):
    """Another rank of the group failed and told this rank to stop."""
