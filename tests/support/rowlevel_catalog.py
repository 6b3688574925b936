"""The test catalog whose tables take MERGE (``autocdc/RowLevelCatalog.java``), compiled against the
installed PySpark's jars: Auto CDC needs such a catalog, and Delta's and Iceberg's jars cannot be had on
these machines (no Maven Central)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).parent / "autocdc" / "RowLevelCatalog.java"
#: Its class, for ``spark.sql.catalog.NAME``.
CLASS = "mcdc.testcatalog.RowLevelCatalog"


def compile_catalog(build: Path) -> Path:
    """The catalog's jar, built under ``build``; skips the test without a JDK."""
    if shutil.which("javac") is None or shutil.which("jar") is None:
        pytest.skip("needs a JDK (javac, jar) to compile the test catalog")
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    subprocess.run(
        ["javac", "-nowarn", "--release", "17", "-d", str(build / "classes"), "-cp", f"{jars}/*", str(SOURCE)],
        check=True, capture_output=True,
    )  # fmt: skip
    jar = build / "rowlevel-catalog.jar"
    subprocess.run(["jar", "cf", str(jar), "-C", str(build / "classes"), "."], check=True, capture_output=True)
    return jar
