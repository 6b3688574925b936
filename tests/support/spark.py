"""The test session's SparkSession: one ``local[2,2]`` session (2 cores, a failed task tried twice) shared
by every Spark test (its start costs 5-10 s and its Python workers about a gigabyte), with the UI off and
the driver on 127.0.0.1.

The executors' Python is this interpreter, so they import the mcdc under test.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# QUICK_JVM: JVM options for short runs, mcdc's own default for a local master's driver (measured here too:
# the cluster test 55 -> 43 s with them on its master, worker and executors)
from replicator.engines.spark.session import QUICK_JVM

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    # measured here over a sync and six catch-ups in one session: no slower than the default JVM, once started
    "spark.driver.extraJavaOptions": QUICK_JVM,
}


#: The start of :func:`quick_spark_home`'s directory names (its layout's version, then pyspark's).
SHADOW_PREFIX = "mcdc-tests-spark-home-2-"


def quick_spark_home() -> Path:
    """A ``SPARK_HOME`` for the suite's JVMs: the pyspark package directory (symbolic links to its entries),
    where ``python/lib/pyspark.zip`` is a directory holding a link to the installed pyspark package, so that
    Spark's Python processes import pyspark from its cached bytecode.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on its Python processes' path, and Python
    compiles every module it imports from a zip, every time (it never caches bytecode there): a Python
    process spent 0.76 CPU-seconds importing what Spark's streaming reader needs, 0.28 from cached bytecode.
    Spark waits a fixed 10 s (no setting) for the streaming reader's Python process it starts at each query
    start to connect back; beside two burners that start took longer, and the query failed with "Python
    worker failed to connect back" (issue 40). The same pyspark files either way, and still there for a
    worker Python that has no pyspark of its own (a path entry named ``.zip`` may be a directory).
    Built once per pyspark directory, under the temporary directory."""
    import pyspark

    real = Path(pyspark.__file__).resolve().parent
    digest = hashlib.sha256(str(real).encode()).hexdigest()[:12]
    home = Path(tempfile.gettempdir()) / f"{SHADOW_PREFIX}{pyspark.__version__}-{digest}"
    if home.is_dir():
        return home
    building = Path(tempfile.mkdtemp(prefix=home.name + ".", dir=home.parent))
    for entry in real.iterdir():
        if entry.name != "python":
            (building / entry.name).symlink_to(entry)
    (building / "python" / "lib" / "pyspark.zip").mkdir(parents=True)
    (building / "python" / "lib" / "pyspark.zip" / "pyspark").symlink_to(real)
    for entry in (real / "python").iterdir():
        if entry.name != "lib":
            (building / "python" / entry.name).symlink_to(entry)
    for entry in (real / "python" / "lib").iterdir():
        if entry.name != "pyspark.zip":
            (building / "python" / "lib" / entry.name).symlink_to(entry)
    try:
        building.rename(home)
    except OSError:  # another process built it first
        shutil.rmtree(building)
        if not home.is_dir():
            raise
    return home


def use_quick_spark_home() -> None:
    """Give this process, and the JVMs and processes it starts, :func:`quick_spark_home`, unless
    ``SPARK_HOME`` names another Spark than the venv's pyspark; and to the JVMs that ``spark-submit`` starts (each
    ``mcdc --engine spark``'s driver, the session's, ``spark-sql``'s, ``spark-pipelines``' server), the archive of
    Spark's classes of :func:`class_archive` through ``SPARK_SUBMIT_OPTS``."""
    import pyspark

    given = os.environ.get("SPARK_HOME")
    ours = given is None or Path(given).name.startswith(SHADOW_PREFIX)
    if not ours and Path(str(given)).resolve() != Path(pyspark.__file__).resolve().parent:
        return
    home = quick_spark_home()
    os.environ["SPARK_HOME"] = str(home)
    if ARCHIVE_OPTION not in os.environ.get("SPARK_SUBMIT_OPTS", "") and (archive := class_archive(home)):
        own = f"{ARCHIVE_OPTION}{archive} {QUIET_ARCHIVE}"
        os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {own}".strip()
    if _SCRATCH_OPTION not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
        os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {scratch_options()}".strip()


#: where a JVM's Hive metastore (Derby: ``metastore_db/``, ``derby.log``) and warehouse would go: the
#: directory it starts in, unless told otherwise
_SCRATCH_OPTION = "-Dderby.system.home="


def scratch_options() -> str:
    """The JVM options that put Spark's metastore, Derby's log and the warehouse under a temporary directory
    of this process's, never the directory a test or ``spark-sql`` starts in (the repository's root)."""
    scratch = Path(tempfile.mkdtemp(prefix="mcdc-spark-scratch-"))
    return f"{_SCRATCH_OPTION}{scratch} -Dspark.sql.warehouse.dir={scratch / 'warehouse'}"


#: The JVM option that maps a class archive (application class data sharing, JDK 13 and later).
ARCHIVE_OPTION = "-XX:SharedArchiveFile="
#: Where the archive cannot serve a JVM (another class path: a ``SPARK_CONF_DIR`` of its own), the JVM goes on
#: without it; these keep the warning it would print from the JVM's standard output, which tests read.
QUIET_ARCHIVE = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: What the archive is made from: a session's start, a query of each kind the suite's JVMs run, its stop.
_ARCHIVE_WORKLOAD = """
import tempfile
from tests.support.spark import start_session
session = start_session()
jvm = session.sparkContext._gateway.proc  # the archive is written as the JVM exits: waited for below
session.range(1000).selectExpr("id % 3 AS k").groupBy("k").count().collect()
with tempfile.TemporaryDirectory() as directory:
    session.createDataFrame([(1, "a")], "a INT, b STRING").write.mode("overwrite").parquet(directory + "/t")
    session.read.parquet(directory + "/t").collect()
    stream = session.readStream.schema("a INT, b STRING").parquet(directory + "/t")
    query = stream.writeStream.format("noop").trigger(availableNow=True).option(
        "checkpointLocation", directory + "/c").start()
    query.awaitTermination()
session.stop()
jvm.stdin.close()  # the JVM's signal to exit
jvm.wait(600)
"""


def class_archive(home: Path) -> Path | None:
    """An archive of the classes a Spark JVM of ``home`` loads (a dynamic AppCDS archive), built once per Java,
    Spark and class path under the temporary directory: a JVM that maps it skips loading and verifying most of
    Spark's classes. Measured here, ``spark-sql -e "SELECT 1"`` with mcdc's JVM options took 13.4 CPU-seconds,
    9.4 with this archive (6.3 with one made by spark-sql itself: this one holds what a PySpark session loads).
    None where it cannot be built (the JVMs then start as usual)."""
    java = shutil.which("java", path=f"{os.environ['JAVA_HOME']}/bin" if os.environ.get("JAVA_HOME") else None)
    if java is None:
        return None
    java_file = Path(java).resolve()
    key = f"{java_file}:{java_file.stat().st_mtime_ns}:{home}:{QUICK_JVM}"
    archive = home.parent / f"mcdc-tests-spark-classes-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsa"
    if archive.is_file():
        return archive
    with open(archive.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds it; the others wait, then use it
        if archive.is_file():
            return archive
        building = archive.with_suffix(f".{os.getpid()}.building")
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={building}"}
        root = Path(__file__).resolve().parents[2]
        try:
            subprocess.run([sys.executable, "-c", _ARCHIVE_WORKLOAD], cwd=root, env=env, timeout=600,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)  # fmt: skip
            building.rename(archive)
        except (OSError, subprocess.SubprocessError):
            building.unlink(missing_ok=True)
            return None
    return archive


def start_session(master: str = "local[2,2]") -> Any:
    """A new (or the already active) SparkSession on ``master``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("mcdc-tests")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


#: How long a test's availableNow query may take to end: seconds alone, a minute or more beside two burners.
QUERY_LIMIT_S = 300


def ended(query: Any) -> None:
    """Wait for the availableNow ``query`` to end, and assert it did, within :data:`QUERY_LIMIT_S`, without an
    error (stopped first when it did not end: its checkpoint is then free for the next query)."""
    done = query.awaitTermination(QUERY_LIMIT_S)
    if not done:
        query.stop()
    assert done, f"the query did not end within {QUERY_LIMIT_S} s"
    assert query.exception() is None, query.exception()


def quick_jvm_options() -> str:
    """:data:`QUICK_JVM`, with the class archive's options where this process's JVMs map one
    (:func:`use_quick_spark_home`): for the JVMs ``spark-submit`` does not start (executors, a cluster's daemons)."""
    archive = [o for o in os.environ.get("SPARK_SUBMIT_OPTS", "").split() if o.startswith(ARCHIVE_OPTION)]
    return " ".join([QUICK_JVM, *archive[-1:], QUIET_ARCHIVE] if archive else [QUICK_JVM])


def quick_jvm_conf() -> list[str]:
    """``--spark-conf`` options giving a driver and its executors :func:`quick_jvm_options`: for the tests that run
    ``mcdc ... --engine spark`` as a process, each of which starts a JVM."""
    return [
        "--spark-conf", f"spark.driver.extraJavaOptions={quick_jvm_options()}",
        "--spark-conf", f"spark.executor.extraJavaOptions={quick_jvm_options()}",
    ]  # fmt: skip
