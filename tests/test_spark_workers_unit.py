"""The check, made when the data source is registered, that Spark's Python workers can import mcdc
(replicator/spark_datasource/workers.py), without Spark: which worker Python it runs and what it says."""

from __future__ import annotations

import sys
import venv
from pathlib import Path
from types import SimpleNamespace

import pytest

from replicator.spark_datasource import workers
from replicator.spark_datasource.options import OptionError


def test_the_driver_s_own_python_is_not_run_again() -> None:
    assert workers.worker_problem(sys.executable, local=True) is None


def test_a_python_that_is_not_there_is_told_on_a_local_master_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    problem = workers.worker_problem("/nowhere/bin/python", local=True)
    assert problem is not None and problem.startswith(
        "Spark's Python workers would run /nowhere/bin/python (PYSPARK_PYTHON is not set), which is not there: "
        f"set PYSPARK_PYTHON to the Python mcdc is installed in ({sys.executable} here)"
    ), problem
    assert workers.worker_problem("./environment/bin/python", local=False) is None  # a cluster's own path


def test_a_python_without_mcdc_is_one_line_naming_pyspark_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv.create(tmp_path / "bare", with_pip=False)
    python = str(tmp_path / "bare" / "bin" / "python")
    monkeypatch.setenv("PYSPARK_PYTHON", python)
    session = SimpleNamespace(sparkContext=SimpleNamespace(pythonExec=python, master="local[2]"))
    with pytest.raises(OptionError) as caught:
        workers.check(session)
    message = str(caught.value)
    assert message.startswith(f"Spark's Python workers run {python} (PYSPARK_PYTHON), which cannot import mcdc "
                              "(ModuleNotFoundError: No module named "), message  # fmt: skip
    assert "spark.pyspark.python" in message and len(message.splitlines()) == 1


def test_spark_connect_is_not_checked() -> None:
    class Connect:
        @property
        def sparkContext(self) -> None:
            raise RuntimeError("[NOT_IMPLEMENTED] sparkContext() is not implemented.")

    workers.check(Connect())
