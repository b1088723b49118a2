"""A real pseudo-terminal for tests: a command runs with a pty as its
controlling terminal, as in a terminal window, so that it sees a TTY and the
terminal's Ctrl-C (the byte 0x03) reaches its foreground process group as SIGINT."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import termios
import threading
from pathlib import Path

from helpers import launch_env, wait_for


class Terminal:
    """``argv`` run in ``cwd`` on a ``columns`` x 40 terminal; everything it
    prints is collected (as bytes) by a reader thread."""

    def __init__(self, argv: list[str], cwd: Path, env: dict | None = None, columns: int = 120):
        environ = launch_env({"TERM": "xterm-256color", **(env or {})})
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: its stdin/stdout/stderr are the terminal
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
            os.chdir(cwd)
            # As a shell starts a foreground job: Ctrl-C's default action, even when this test run
            # was started in the background (nohup ... &), whose processes inherit SIGINT ignored.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execvpe(argv[0], argv, environ)
        self.data = bytearray()
        self.status: int | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: every process holding the terminal is gone
                return
            if not chunk:
                return
            self.data += chunk

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")

    def ctrl_c(self) -> None:
        """Type Ctrl-C: the terminal sends SIGINT to its foreground process group."""
        os.write(self.fd, b"\x03")

    def exited(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is not None

    def wait(self, timeout: float) -> int:
        """The exit status (negative: killed by that signal), once the command and the output have
        ended."""
        try:
            wait_for(self.exited, timeout, f"{self.pid} to exit")
        except AssertionError as e:
            raise AssertionError(f"{e}; its terminal so far:\n{self.text[-3000:]}") from None
        self.reader.join(timeout=10)
        os.close(self.fd)
        assert self.status is not None
        return self.status
