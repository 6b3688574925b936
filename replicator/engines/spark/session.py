"""Getting a SparkSession for ``--engine spark``: pyspark and Java checked first, with one-line errors;
the session ``spark-submit`` started is used as it is; Spark's console noise goes to a log file unless
``--verbose``, which the CLI names when the run fails and removes when it succeeds."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from replicator.errors import ConfigError
from replicator.settings.config import Settings

log = logging.getLogger("mcdc.spark")

MIN_JAVA = 17
#: Spark settings mcdc sets unless --spark-conf or spark-submit says otherwise.
DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.python.worker.reuse": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}
#: JVM options of a local master's driver (unless --spark-conf sets spark.driver.extraJavaOptions): the C1
#: compiler only and the serial collector start the JVM sooner on a busy machine (a local[2] session and its
#: first job: 6.1 -> 4.8 s measured idle), and the JVM of a local run does no work on documents: the copy and the
#: replay's writes run in Python workers.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: A local master retries a failed task this many times (Spark's local mode does not retry otherwise).
LOCAL_TASK_ATTEMPTS = 4
_LOCAL = re.compile(r"^local(\[(\*|\d+)\])?$")
#: The file this process gave the console of the Spark it started (its PID's); empty until then. Process
#: state, as the console (file descriptor 2) it stands for is.
_console_logs: set[Path] = set()


def require_pyspark() -> None:
    if importlib.util.find_spec("pyspark") is None:
        raise ConfigError("--engine spark needs PySpark: pip install 'mcdc[spark]'")


def java_version(java: str) -> int | None:
    """The major version ``java -version`` reports, or None when it cannot be read."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_java_version(out.stderr + out.stdout)


def parse_java_version(text: str) -> int | None:
    """``openjdk version "17.0.15"`` -> 17, ``java version "1.8.0_392"`` -> 8."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def check_java() -> None:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise ConfigError(f"--engine spark needs Java {MIN_JAVA}+: no java found (install one, or set JAVA_HOME)")
    version = java_version(java)
    if version is None or version < MIN_JAVA:
        found = f"Java {version}" if version else "a Java whose version could not be read"
        raise ConfigError(f"--engine spark needs Java {MIN_JAVA}+: {java} is {found} (set JAVA_HOME to a newer one)")


def master_url(master: str) -> str:
    """A local master with task retries (``local[*]`` -> ``local[*,4]``); others as given."""
    found = _LOCAL.match(master)
    if found is None:
        return master
    return f"local[{found.group(2) or 1},{LOCAL_TASK_ATTEMPTS}]"


def spark_conf(settings: Settings) -> dict[str, str]:
    conf = dict(DEFAULTS)
    if _LOCAL.match(settings.spark_master):
        conf["spark.driver.extraJavaOptions"] = QUICK_JVM
    for item in settings.spark_conf:
        key, _, value = item.partition("=")
        conf[key.strip()] = value.strip()
    return conf


def session(settings: Settings) -> Any:
    """The active SparkSession (under spark-submit, or a test's), else a new one on --spark-master (see
    :func:`owned`)."""
    active = active_session(settings)
    if active is not None:
        return active
    check_java()
    launch(settings)
    return create(settings)


def active_session(settings: Settings) -> Any:
    """The session this process runs already (spark-submit's, a test's), or None; PySpark checked first."""
    require_pyspark()
    from pyspark.sql import SparkSession

    quiet_py4j(settings)
    return SparkSession.getActiveSession() or existing()


def launch(settings: Settings) -> None:
    """Start the JVM of the session :func:`create` makes next, its console given to a log file unless
    --verbose (see :func:`_console_path`). The JVM is handed the file as it is launched: this process's own
    stderr stays as it is, so its lines go on to the console while a run launches Spark beside it."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors import this mcdc
    conf = SparkConf().setMaster(master_url(settings.spark_master)).setAppName("mcdc")
    for key, value in spark_conf(settings).items():
        conf.set(key, value)
    if settings.verbose or SparkContext._gateway is not None:  # the console as it is; or a JVM up already
        SparkContext._ensure_initialized(conf=conf)
        return
    path = _console_path()
    with open(path, "ab") as console:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": console})  # type: ignore[no-untyped-call]
    SparkContext._ensure_initialized(gateway=gateway, conf=conf)


def create(settings: Settings) -> Any:
    """The SparkSession, on the JVM :func:`launch` started (or on one it starts now, with stderr as it is)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master_url(settings.spark_master)).appName("mcdc")
    for key, value in spark_conf(settings).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("INFO" if settings.verbose else "ERROR")
    return spark


def quiet_py4j(settings: Settings) -> None:
    """py4j (PySpark's bridge to the JVM) logs each callback at INFO, and an error raised in a callback
    (a micro-batch the sink failed, which mcdc retries and reports itself) with its traceback at ERROR:
    only with --debug-driver."""
    logging.getLogger("py4j").setLevel(logging.DEBUG if settings.debug_driver else logging.CRITICAL)


def _console_path() -> Path:
    """The file the console of the Spark this process starts goes to (its start-up lines and later warnings
    stay out of mcdc's output), named when a run fails."""
    path = Path(tempfile.gettempdir()) / f"mcdc-spark-{os.getpid()}.log"
    _console_logs.add(path)
    log.debug("Spark's console output goes to %s", path)
    return path


def console_log() -> Path | None:
    """The file this process's Spark wrote its console to (None with --verbose, under spark-submit, or
    before Spark started), while it is there."""
    return next((path for path in _console_logs if path.exists()), None)


def drop_console_log() -> None:
    """After a run that succeeded: nothing in Spark's console log is worth keeping."""
    for path in _console_logs:
        path.unlink(missing_ok=True)
    _console_logs.clear()


def existing() -> Any:
    """The session this process already runs, or None (getActiveSession only sees the thread that made it)."""
    if importlib.util.find_spec("pyspark") is None:
        return None
    from pyspark.sql import SparkSession

    return SparkSession._instantiatedSession


def stop_owned(spark: Any, before: Any) -> None:
    """Stop ``spark`` if this run started it (``before``: the session that existed when it began)."""
    if spark is not None and spark is not before:
        spark.stop()
