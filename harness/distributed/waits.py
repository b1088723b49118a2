"""How a bounded wait ended, said as it happened.

A wait's error used to state its configured timeout ("gave up after 60 s")
whether it had waited that long or failed a second in, when a peer died and
its connection closed. A :class:`Wait` is a monotonic clock started with the
wait: its error says how long it waited and, when the cause's text tells
(a connection refused or closed by the other end), that the peer is gone,
first; only a wait that ran to its limit suggests raising the limit.
:class:`LateWatch` also names, in the log, a peer that keeps a wait going past a
shorter bound (a stopped or stalled process), while the wait goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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


class Late:
    """What a watched wait learned: whether it was named late, and when it began."""

    def __init__(self) -> None:
        self.named, self.started = False, time.monotonic()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


class LateWatch:
    """Names a wait that goes on past ``late_s`` (0: never), once, from a helper thread of its own,
    while the wait goes on: a Gloo receive that a shorter wait gave up on cannot be waited on
    again, so the wait itself is left alone. One wait at a time (its owner's thread)."""

    def __init__(self, late_s: float):
        self.late_s = late_s
        self._cond = threading.Condition()
        self._due: tuple[float, Callable[[], object], Late] | None = None
        self._thread: threading.Thread | None = None
        self._idle = False  # the helper waits for a wait to watch, without a deadline

    @contextmanager
    def watching(self, name_late: Callable[[], object]) -> Iterator[Late]:
        """Within it, ``name_late()`` is called once the block has run ``late_s``; the
        :class:`Late` it yields says whether it was (for a line saying when the wait ended)."""
        late = Late()
        if not self.late_s:
            yield late
            return
        with self._cond:
            self._due = (late.started + self.late_s, name_late, late)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="late-watch", daemon=True)
                self._thread.start()
            if self._idle:  # else it wakes at the deadline it has and finds this one: no
                self._cond.notify()  # wake-up per wait (one per batch, one per publish)
        try:
            yield late
        finally:
            with self._cond:
                self._due = None

    def _watch(self) -> None:
        while True:
            with self._cond:
                while self._due is None or self._due[0] > time.monotonic():
                    self._idle = self._due is None
                    self._cond.wait(None if self._due is None else self._due[0] - time.monotonic())
                    self._idle = False
                _, name_late, late = self._due
                self._due, late.named = None, True
                name_late()  # under the lock: said before the wait's end can say it ended
