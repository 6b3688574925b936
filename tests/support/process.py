"""The process management shared by the local servers the tests start (:mod:`tests.support.servers`,
:mod:`tests.support.kafka`): spawn with output to a log file, wait for readiness with a deadline, stop with
SIGTERM falling back to SIGKILL, kill, restart, and the log's tail for error messages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Self

LOG_TAIL_BYTES = 4000


class ManagedProcess(ABC):
    """One server process on ``host:port``, or (when :attr:`external`) a server run elsewhere.

    A subclass says how to start it (:meth:`argv`, :meth:`prepare`, :attr:`cwd`) and how to tell that it
    is ready (:meth:`probe`); this class runs it.  Output goes to :attr:`log_path`: a file, not a pipe, so a
    chatty server can never block on a full pipe buffer.  The port is chosen once, so :meth:`restart` brings
    the server back at the same address.

    When :attr:`external` is True nothing is started: :meth:`start` only waits until the server answers,
    :meth:`stop` and :meth:`terminate` do nothing, and :meth:`spawn`, :meth:`kill` and :meth:`restart` raise.
    """

    #: What the process is, for messages ("server", "broker").
    kind: ClassVar[str] = "process"
    #: What :meth:`probe` checks, for the timeout message ("answer ping").
    readiness: ClassVar[str] = "become ready"
    #: Exceptions from :meth:`probe` that mean "not ready yet" rather than a bug.
    probe_errors: ClassVar[tuple[type[Exception], ...]] = (OSError,)
    #: Seconds between two probes while waiting for readiness.
    poll_interval: ClassVar[float] = 0.1

    def __init__(self, host: str, port: int, log_path: Path | None, *, startup_timeout: float = 20.0) -> None:
        self.host = host
        self.port = port
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._terminating = False

    @abstractmethod
    def argv(self) -> list[str]:
        """The command line that starts the process (may raise if its executable is not installed)."""

    @abstractmethod
    def probe(self) -> None:
        """Return if the server is ready; raise one of :attr:`probe_errors` saying why not otherwise."""

    @property
    def cwd(self) -> Path | None:
        """Working directory of the process (None: the caller's)."""
        return None

    @abstractmethod
    def prepare(self) -> None:
        """Called by :meth:`spawn` just before the process starts, e.g. to create its data directory."""

    @property
    def external(self) -> bool:
        """Whether the server runs elsewhere (and so cannot be started, stopped, killed or restarted here)."""
        return False

    @property
    def name(self) -> str:
        """``<kind> on port <port>``, naming the server in messages."""
        return f"{self.kind} on port {self.port}"

    @property
    def running(self) -> bool:
        """Whether the process has been started and has not exited (always True when external)."""
        return self.external or (self._process is not None and self._process.poll() is None)

    def start(self) -> None:
        """Start the process and wait until it is ready (when external: only wait)."""
        if not self.external:
            self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start the process without waiting, so several can boot in parallel; then call :meth:`wait_ready`."""
        self._require_local("start")
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        args = self.argv()  # before opening the log: a missing executable leaves nothing behind
        assert self.log_path is not None, "a local process needs a log_path"
        self.prepare()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap()
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.cwd
        )

    def wait_ready(self) -> None:
        """Block until :meth:`probe` passes; raise with the log's tail if the process dies or the startup
        timeout passes first (killing the process then)."""
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if not self.external and (self._process is None or self._process.poll() is not None):
                raise RuntimeError(f"{self.name} exited during startup:\n{self.log_tail()}")
            try:
                self.probe()
                return
            except self.probe_errors as exc:
                problem = exc
            if time.monotonic() > deadline:
                if not self.external:
                    self.kill()
                raise RuntimeError(
                    f"{self.name} did not {self.readiness} within {self.startup_timeout} s ({problem}):\n"
                    f"{self.log_tail()}"
                )
            time.sleep(self.poll_interval)

    def terminate(self) -> None:
        """Send SIGTERM without waiting, so several processes can shut down in parallel; then call :meth:`stop`."""
        if self._process is not None and self._process.poll() is None and not self._terminating:
            self._terminating = True  # a second SIGTERM could cut a clean shutdown short
            self._process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop with SIGTERM (a clean shutdown), falling back to SIGKILL after ``timeout``."""
        self.terminate()
        if self._process is not None:
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._reap()

    def kill(self) -> None:
        """Kill the process with SIGKILL, as a crash would."""
        self._require_local("kill")
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        self._reap()

    def pause(self) -> None:
        """SIGSTOP: the process holds its connections open and answers nothing (a hung server)."""
        self._require_local("pause")
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Stop cleanly and start again on the same port over the same data."""
        self._require_local("restart")
        self.stop()
        self.start()

    def log_tail(self, size: int = LOG_TAIL_BYTES) -> str:
        """The last ``size`` bytes of the process's log, for error messages."""
        if self.log_path is None:
            return f"(external {self.kind}: no log here)"
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - size))
                return log.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(no log at {self.log_path}: {exc})"

    def _require_local(self, what: str) -> None:
        if self.external:
            raise RuntimeError(f"cannot {what} the external {self.name}")

    def _reap(self) -> None:
        if self._process is not None:
            self._process.wait()
            self._process = None
        self._terminating = False
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
