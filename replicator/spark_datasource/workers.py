"""Can Spark's Python workers import mcdc? Checked when the data source is registered.

Spark's Python workers do not run the driver's interpreter but ``PYSPARK_PYTHON`` (``python3`` when it is
not set), read once, as the SparkContext starts; spark-submit sets it from ``spark.pyspark.python``, which
a session built in Python ignores. The data source's class travels to them by name, so a worker Python
without mcdc fails at ``load()`` with ``ModuleNotFoundError: No module named 'replicator'`` inside
Spark's traceback. The planning workers run on the driver's machine, so :func:`check` runs that Python
there, with the path Spark gives its workers, and tells the fix in one line instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from typing import Any

from replicator.spark_datasource.guard import FIX, cannot_import
from replicator.spark_datasource.options import OptionError

#: What a worker imports to run the data source.
MODULE = "replicator.spark_datasource.datasource"
#: Long enough for a cold start of that import (about a second here).
CHECK_TIMEOUT_S = 60.0


def check(spark: Any) -> None:
    """Raise a one-line ConfigError when ``spark``'s Python workers cannot import mcdc. Nothing to check
    on Spark Connect (its server's workers are not this machine's to run) or when the workers run this
    very interpreter."""
    try:
        context = spark.sparkContext
        python = str(context.pythonExec)
        master = str(context.master)
    except Exception:  # Spark Connect: no SparkContext here
        return
    problem = worker_problem(python, master.startswith("local"))
    if problem is not None:
        raise OptionError(problem)


def worker_problem(python: str, local: bool) -> str | None:
    """Why the worker Python ``python`` cannot run the data source, or None when it can (or when it is not
    on this machine and the master is not ``local``: a cluster's path, such as an unpacked archive's)."""
    found = shutil.which(python)
    if found is not None and os.path.abspath(found) == os.path.abspath(sys.executable):
        return None
    named = _named(python)
    if found is None:
        if not local:
            return None
        return f"Spark's Python workers would run {named}, which is not there: {_fix()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*_spark_python_path(), os.environ.get("PYTHONPATH", "")])}
    try:
        result = subprocess.run(
            [found, "-c", f"import {MODULE}"], env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Spark's Python workers run {named}, which cannot be run ({exc}): {_fix()}"
    if result.returncode == 0:
        return None
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    why = lines[-1].strip() if lines else f"exit status {result.returncode}"
    return cannot_import(named, why, sys.executable)


def _fix() -> str:
    return FIX.format(here=f" ({sys.executable} here)")


def _named(python: str) -> str:
    given = os.environ.get("PYSPARK_PYTHON")
    return f"{python} (PYSPARK_PYTHON)" if given == python else f"{python} (PYSPARK_PYTHON is not set)"


def _spark_python_path() -> list[str]:
    """pyspark and py4j as Spark's workers find them (its python/lib zips), ahead of the user's path."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    return sorted(glob.glob(os.path.join(home, "python", "lib", "*.zip")))
