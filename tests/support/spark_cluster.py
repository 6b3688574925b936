"""A real Spark standalone cluster started from the pip package: one master and one worker on 127.0.0.1,
each a :class:`~tests.support.process.ManagedProcess` whose readiness is a line in its own log.

``SPARK_HOME`` is the pyspark package directory, as linked by tests/support/spark.py (its ``bin/spark-class``
starts any Spark class); both daemons get a small heap, and each web UI a free port of its own, so two runs on
one machine never clash.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import ClassVar

from tests.support.process import ManagedProcess
from tests.support.servers import free_port
from tests.support.spark import quick_jvm_options, quick_spark_home

#: The daemons' heap (Spark's default is 1g each; the executors get their own).
DAEMON_MEMORY = "512m"


def spark_home() -> Path:
    """The pyspark package directory, which holds ``bin/spark-class`` and the jars (its pyspark.zip unzipped:
    see :func:`~tests.support.spark.quick_spark_home`)."""
    return quick_spark_home()


class _Daemon(ManagedProcess):
    """A Spark daemon started by ``spark-class``; ready once :attr:`ready_line` shows in its log."""

    ready_line: ClassVar[str]
    main_class: ClassVar[str]
    poll_interval = 0.2

    def argv(self) -> list[str]:
        env = shutil.which("env") or "/usr/bin/env"
        home = spark_home()
        settings = [
            f"SPARK_HOME={home}",
            f"SPARK_DAEMON_MEMORY={DAEMON_MEMORY}",
            f"SPARK_DAEMON_JAVA_OPTS={quick_jvm_options()}",
        ]
        return [env, *settings, str(home / "bin" / "spark-class"), self.main_class, *self.arguments()]

    def arguments(self) -> list[str]:
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        """The daemon's process id (the JVM: spark-class execs it), None when not running."""
        return self._process.pid if self._process is not None and self.running else None

    def prepare(self) -> None:
        pass

    def probe(self) -> None:
        if self.ready_line not in self.log_tail(1 << 20):
            raise OSError(f"no {self.ready_line!r} in {self.log_path} yet")


class Master(_Daemon):
    """The standalone master on ``spark://127.0.0.1:<port>``."""

    kind = "Spark master"
    readiness = "log ALIVE"
    ready_line = "ALIVE"
    main_class = "org.apache.spark.deploy.master.Master"

    def __init__(self, base_dir: Path, *, startup_timeout: float = 60.0) -> None:
        super().__init__("127.0.0.1", free_port(), Path(base_dir) / "master.log", startup_timeout=startup_timeout)
        self.webui_port = free_port()

    @property
    def url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def arguments(self) -> list[str]:
        return ["--host", self.host, "--port", str(self.port), "--webui-port", str(self.webui_port)]


class Worker(_Daemon):
    """One worker of ``master`` with ``cores`` cores; its executors' directories go under :attr:`work_dir`."""

    kind = "Spark worker"
    readiness = "register with the master"
    ready_line = "Successfully registered with master"
    main_class = "org.apache.spark.deploy.worker.Worker"

    def __init__(
        self, master: Master, base_dir: Path, *, cores: int = 2, memory: str = "2g", startup_timeout: float = 60.0
    ) -> None:
        super().__init__("127.0.0.1", free_port(), Path(base_dir) / "worker.log", startup_timeout=startup_timeout)
        self.master = master
        self.cores = cores
        self.memory = memory
        self.work_dir = Path(base_dir) / "work"
        self.webui_port = free_port()

    def prepare(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)

    def arguments(self) -> list[str]:
        return [
            "--host", self.host, "--port", str(self.port), "--webui-port", str(self.webui_port),
            "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(self.work_dir),
            self.master.url,
        ]  # fmt: skip

    def executor_dirs(self) -> list[Path]:
        """``<work_dir>/app-*/<executor id>``: one per executor this worker launched."""
        return sorted(path for path in self.work_dir.glob("app-*/*") if path.is_dir())


class Cluster:
    """A master and one worker under ``base_dir``; :meth:`start` returns once the worker has registered."""

    def __init__(self, base_dir: Path, *, cores: int = 2, memory: str = "2g") -> None:
        base = Path(base_dir)
        base.mkdir(parents=True, exist_ok=True)
        self.master = Master(base)
        self.worker = Worker(self.master, base, cores=cores, memory=memory)

    @property
    def url(self) -> str:
        return self.master.url

    def start(self) -> None:
        # The worker only after the master is up: a worker that finds no master retries 5-15 s later.
        try:
            self.master.start()
            self.worker.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for daemon in (self.worker, self.master):
            daemon.terminate()
        for daemon in (self.worker, self.master):
            daemon.stop()


def cluster_environment() -> dict[str, str]:
    """The environment for a driver on the cluster: executors run this interpreter (the venv's, with mcdc)."""
    import sys

    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
