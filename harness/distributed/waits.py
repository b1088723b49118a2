"""How a bounded wait ended, said as it happened.

A wait's error used to state its configured timeout ("gave up after 60 s")
whether it had waited that long or failed a second in, when a peer died and
its connection closed. A :class:`Wait` is a monotonic clock started with the
wait: its error says how long it waited and, when the cause's text tells
(a connection refused or closed by the other end), that the peer is gone,
first; only a wait that ran to its limit suggests raising the limit.
"""

from __future__ import annotations

import time

# What a peer's end looks like in the errors of gloo, the TCP store, the OS and the shared-memory
# reader.
_GONE = (
    (("connection refused",), "the connection was refused"),
    (
        (
            "connection reset",
            "reset by peer",
            "closed by peer",
            "connection closed",
            "likely closed",
            "broken pipe",
        ),
        "the connection was closed",
    ),
    (("is dead",), "its process is dead"),
)


def peer_gone(cause: object) -> str | None:
    """What ``cause`` (an error, or its text) says of the peer: ``the connection was refused``,
    ``the connection was closed``, ``its process is dead``; None when it does not say."""
    text = str(cause).lower()
    for patterns, said in _GONE:
        if any(p in text for p in patterns):
            return said
    return None


class Wait:
    """One bounded wait: ``timeout_s`` (``setting``: the config key that sets it, for
    advice), from now or from ``started`` (a ``time.monotonic()`` reading)."""

    def __init__(self, timeout_s: float, setting: str = "", started: float | None = None):
        self.timeout_s, self.setting = timeout_s, setting
        self.started = time.monotonic() if started is None else started

    @property
    def seconds(self) -> float:
        """How long it has waited so far."""
        return time.monotonic() - self.started

    @property
    def ran_out(self) -> bool:
        """It waited its whole limit (a clock's grain less): slow or stalled, not failed."""
        return self.seconds >= 0.99 * self.timeout_s

    @property
    def remaining(self) -> float:
        """Seconds left of its limit (negative once it ran out)."""
        return self.timeout_s - self.seconds

    def ended(self, cause: object, peer: str = "the peer") -> str:
        """How it ended, for an error message: ``the peer is gone (the connection
        was closed), 0.4 s in`` (``peer``: who was waited for), ``no answer in
        60.0 s (dist_timeout_s=60)``, or ``failed after 0.4 s (its limit: 60 s)``."""
        gone = peer_gone(cause)
        if gone is not None:
            return f"{peer} is gone ({gone}), {self.seconds:.1f} s in"
        if self.ran_out:
            limit = (
                f"{self.setting}={self.timeout_s:g}"
                if self.setting
                else f"its limit: {self.timeout_s:g} s"
            )
            return f"no answer in {self.seconds:.1f} s ({limit})"
        return f"failed after {self.seconds:.1f} s (its limit: {self.timeout_s:g} s)"

    def advice(self, what: str = "it is only slow") -> str:
        """``; raise dist_timeout_s if it is only slow`` for a wait that ran out; nothing for one
        that failed."""
        return f"; raise {self.setting} if {what}" if self.ran_out and self.setting else ""
