"""Sleeping until a word of shared memory changes: Linux futexes, through ctypes.

A shared-memory reader that waits for an update sleeps in the kernel on its
segment's bell word, and the writer wakes every sleeper after each write. No
reader burns a core polling, however many share a node (31 readers polling
every 0.2 ms kept both cores of a 2-core machine busy), and a wake-up takes
tens of microseconds. Where there is no futex (not Linux, an architecture not
listed, a big-endian machine), :func:`wait` sleeps ``fallback_s`` instead and
callers check again.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys
import time
from collections.abc import Callable

FUTEX_WAIT, FUTEX_WAKE = 0, 1  # not the _PRIVATE forms: the word is shared between processes
SYSCALL_NUMBERS = {"x86_64": 202, "aarch64": 98, "arm64": 98, "riscv64": 98, "ppc64le": 221}
WAKE_ALL = 2**31 - 1


def _futex_call() -> Callable[..., int] | None:
    number = (
        SYSCALL_NUMBERS.get(platform.machine())
        if sys.platform == "linux" and sys.byteorder == "little"
        else None
    )
    if number is None:
        return None
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    return lambda address, op, value, timeout: syscall(
        ctypes.c_long(number),
        ctypes.c_void_p(address),
        ctypes.c_int(op),
        ctypes.c_int(value),
        timeout,
        None,
        ctypes.c_int(0),
    )


_futex = _futex_call()


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def available() -> bool:
    """This machine waits with futexes (else by sleeping between checks)."""
    return _futex is not None


def wait(address: int, seen: int, timeout_s: float, fallback_s: float = 0.0002) -> int:
    """Sleep while the 32-bit word at ``address`` (the low half of a
    little-endian int64) holds ``seen``'s low 32 bits, until a :func:`wake`
    or ``timeout_s``. Returns 0 when woken, ``errno.EAGAIN`` when the word had
    changed already, ``errno.ETIMEDOUT`` (or ``EINTR``) otherwise; callers
    check their condition again whatever it returns."""
    if _futex is None:
        time.sleep(min(fallback_s, timeout_s))
        return errno.ETIMEDOUT
    timeout_s = max(timeout_s, 0.0)
    ts = _Timespec(int(timeout_s), int(timeout_s % 1 * 1e9))
    result = _futex(address, FUTEX_WAIT, seen & 0xFFFFFFFF, ctypes.byref(ts))
    return 0 if result == 0 else ctypes.get_errno()


def wake(address: int) -> None:
    """Wake every process sleeping on the word at ``address``."""
    if _futex is not None:
        _futex(address, FUTEX_WAKE, WAKE_ALL, None)
