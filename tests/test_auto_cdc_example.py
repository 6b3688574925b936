"""The Auto CDC example (examples/spark/auto_cdc) runs as its README says, and stops in one line without
what it needs.

* The README's steps 2 and 3 (every ``bash`` block after the dev server's) run as written, in order, in one
  shell, through the real ``spark-pipelines`` and ``spark-sql``, against the test server. One stand-in:
  ``conf/iceberg/spark-defaults.conf`` names a test catalog whose tables take MERGE as ``lake``
  (tests/support/rowlevel_catalog.py), since Iceberg's and Delta's jars cannot be had here (no Maven
  Central); and the spec's storage is moved into the test's directory. SCD1 equals the source, SCD2 holds
  the versions the README describes.
* Without a catalog, without the schema, or without the catalog's jar, ``spark-pipelines run`` prints the
  very ``mcdc:`` line the README quotes, with no traceback, before the run starts.
* The README's commands, the example's defaults and ``mcdc dev-server`` agree (no server needed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pymongo
import pytest

from replicator.bsonkit.extjson import dumps_str
from replicator.job import devserver
from replicator.settings.resolve import load_env
from tests.support.rowlevel_catalog import CLASS, compile_catalog
from tests.support.spark import SHADOW_PREFIX

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "spark" / "auto_cdc"
README = EXAMPLE / "README.md"
SPEC = "examples/spark/auto_cdc/spark-pipeline.yml"
STORAGE = "file:///tmp/mcdc-auto-cdc/storage"
#: What ``mcdc dev-server`` prints on its default port (SecantusDB's replica set is named secantus).
DEV_SERVER_URI = f"mongodb://{devserver.HOST}:{devserver.DEFAULT_PORT}/?replicaSet=secantus"
#: A run that fails must fail before this line of spark-pipelines (no stream started).
RUN_STARTS = "Starting run..."
#: A spark-pipelines or spark-sql command, or the README's steps, are done within this (a safety net, not a
#: measure: the steps take about five minutes on a busy 2-core machine).
TIMEOUT_S = 1200


def _blocks() -> list[str]:
    """The example README's bash blocks."""
    return re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.S | re.M)


def _steps() -> list[str]:
    """The blocks a reader runs in the second terminal: every one after the dev server's."""
    blocks = _blocks()
    assert blocks[0].startswith("mcdc dev-server"), blocks[0]
    return blocks[1:]


def _quoted_errors() -> list[str]:
    """The one-line ``mcdc:`` errors the README quotes, in its order."""
    return [line.strip() for line in re.findall(r"^ *```text\n *(mcdc: .*?)\n *```", README.read_text(), re.M)]


def _environment(**extra: str) -> dict[str, str]:
    """The reader's environment: this venv's commands first on PATH, nothing of the reader's Spark or mcdc.

    Two differences: SPARK_TESTING makes the local Spark Connect server that spark-pipelines starts take an
    ephemeral port (pyspark's own tests do so, SPARK-42272), not 15002, which two runs at once (two
    pytest workers) would fight over; and the suite's SPARK_HOME stays (the same pyspark, its
    pyspark.zip unzipped: tests/support/spark.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_", "MCDC_SOURCE"))}
    if Path(os.environ.get("SPARK_HOME", "")).name.startswith(SHADOW_PREFIX):
        env["SPARK_HOME"] = os.environ["SPARK_HOME"]
    env.pop("MCDC_DATABASE", None)
    env.pop("MCDC_COLLECTION", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "SPARK_TESTING": "1", **extra}


def _checkout(root: Path, conf: str | None) -> Path:
    """A copy of the example where the README's relative paths find it (``root`` stands for the
    repository's root), its storage under ``root``; ``conf`` replaces conf/iceberg/spark-defaults.conf."""
    example = root / "examples" / "spark" / "auto_cdc"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("__pycache__"))
    spec = example / "spark-pipeline.yml"
    assert STORAGE in spec.read_text()
    spec.write_text(spec.read_text().replace(STORAGE, (root / "storage").as_uri()))
    if conf is not None:
        (example / "conf" / "iceberg" / "spark-defaults.conf").write_text(conf)
    return example


def _test_catalog(jar: Path, directory: Path, *, strict: bool) -> str:
    """A spark-defaults.conf naming the test catalog as ``lake``, with its tables under ``directory``
    (``strict``: a schema exists only once created, as in Iceberg)."""
    lines = [f"spark.jars {jar}", f"spark.sql.catalog.lake {CLASS}", f"spark.sql.catalog.lake.path {directory}"]
    if strict:
        lines.append("spark.sql.catalog.lake.namespaces strict")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def catalog_jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_catalog(tmp_path_factory.mktemp("catalog"))


def _rows(output: str, columns: int) -> dict[str, list[tuple[str, ...]]]:
    """spark-sql's result rows of ``columns`` tab-separated values whose first is a key, by canonical _id."""
    from bson import json_util

    from replicator.bsonkit.extjson import CANONICAL

    out: dict[str, list[tuple[str, ...]]] = {}
    for line in output.splitlines():
        values = line.split("\t")
        if len(values) == columns and values[0].startswith("{"):
            key = dumps_str(json_util.loads(values[0], json_options=CANONICAL))
            out.setdefault(key, []).append(tuple(values[1:]))
    return out


def _source(uri: str) -> dict[str, list[tuple[str, ...]]]:
    with pymongo.MongoClient(uri) as client:
        return {dumps_str(d["_id"]): [(d["name"], str(d["age"]))] for d in client.shop.users.find()}


#: Printed between the README's blocks, to cut the shell's output into each block's.
MARK = "=== mcdc test: next block ==="


def _run_blocks(blocks: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    """Run ``blocks`` in order in one shell, as a reader does in one terminal; each one's standard output."""
    script = f"\necho '{MARK}'\n".join(blocks)
    proc = subprocess.run(
        ["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{script}\n{output[-6000:]}"
    return proc.stdout.split(MARK + "\n")


@pytest.mark.integration
@pytest.mark.timeout(TIMEOUT_S + 60)  # two pipeline runs and four spark-sql, each a JVM of its own
def test_spark_pipelines_runs_the_example_as_its_readme_says_into_scd1_and_scd2_tables(
    catalog_jar: Path, source_uri: str, tmp_path: Path
) -> None:
    _checkout(tmp_path, _test_catalog(catalog_jar, tmp_path / "lake", strict=True))
    first, second = (block.replace(DEV_SERVER_URI, source_uri) for block in _steps())
    # step 2 (ten documents, the schema, a run, the SCD1 table), step 3 (an update, a delete and an insert,
    # a run, the SCD2 table), then step 2's look at the SCD1 table again
    after_first, after_second, scd1 = _run_blocks([first, second, first.splitlines()[-1]], tmp_path, _environment())
    ten = {dumps_str(i): [(f"user{i}", str(20 + i))] for i in range(10)}
    assert _rows(after_first, 3) == ten
    source = _source(source_uri)
    assert len(source) == 10 and dumps_str(2) not in source and dumps_str(10) in source
    assert _rows(scd1, 3) == source
    history = _rows(after_second, 5)
    current = {key: [v[:2] for v in versions if v[3] == "NULL"] for key, versions in history.items()}
    assert {key: rows for key, rows in current.items() if rows} == source
    versions = {key: [(name, age, end == "NULL") for name, age, _, end in rows] for key, rows in history.items()}
    assert versions.pop(dumps_str(1)) == [("user1", "21", False), ("user1", "40", True)]
    assert versions.pop(dumps_str(2)) == [("user2", "22", False)]  # deleted: its version closed
    assert versions.pop(dumps_str(10)) == [("new", "1", True)]
    assert versions == {dumps_str(i): [(f"user{i}", str(20 + i), True)] for i in (0, *range(3, 10))}


@pytest.mark.integration
@pytest.mark.parametrize("missing", ["catalog", "schema", "jar"])
def test_spark_pipelines_stops_the_example_in_the_readme_s_one_line_before_the_run(
    catalog_jar: Path, tmp_path: Path, missing: str
) -> None:
    if missing == "catalog":  # SPARK_CONF_DIR names no catalog
        conf = ""
    elif missing == "schema":  # step 2's CREATE NAMESPACE left out
        conf = _test_catalog(catalog_jar, tmp_path / "lake", strict=True)
    else:  # Iceberg's own settings, its jar not fetched
        real = (EXAMPLE / "conf" / "iceberg" / "spark-defaults.conf").read_text()
        conf = "".join(line for line in real.splitlines(keepends=True) if not line.startswith("spark.jars"))
    example = _checkout(tmp_path, conf)
    env = _environment(SPARK_CONF_DIR=str(example / "conf" / "iceberg"), PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(
        ["spark-pipelines", "run", "--spec", SPEC], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    expected = _quoted_errors()[["catalog", "schema", "jar"].index(missing)]
    assert proc.returncode != 0
    assert expected in output.splitlines(), output[-4000:]
    assert "Traceback" not in output and RUN_STARTS not in output, output[-4000:]
    assert "Importing" in output  # the pipeline's own check said it, not Spark's graph


def test_the_readme_steps_are_the_example_s_commands_with_the_dev_server_s_defaults() -> None:
    blocks = _blocks()
    assert blocks[0].split("#")[0].split() == ["mcdc", "dev-server", "--port", str(devserver.DEFAULT_PORT), "--dir",
                                               "mcdc-dev-data"]  # fmt: skip
    assert DEV_SERVER_URI in blocks[0]  # what it prints
    first, second = _steps()
    assert f'export MCDC_SOURCE="{DEV_SERVER_URI}" MCDC_DATABASE=shop MCDC_COLLECTION=users' in first
    assert "export SPARK_CONF_DIR=$PWD/examples/spark/auto_cdc/conf/iceberg PYSPARK_PYTHON=$(which python)" in first
    for block in (first, second):
        assert f"spark-pipelines run --spec {SPEC}" in block.splitlines()
    # the transformations' defaults are the dev server's and the README's
    code = (EXAMPLE / "transformations" / "users.py").read_text()
    assert f'DEV_SERVER = "{DEV_SERVER_URI}"' in code
    assert 'os.environ.get("MCDC_DATABASE") or "shop"' in code
    assert 'os.environ.get("MCDC_COLLECTION") or "users"' in code
    assert 'merge_catalog(spark, DATABASE, "lake")' in code
    assert (REPO / SPEC).read_text().count(STORAGE) == 1
    # the three one-line errors, quoted
    quoted = _quoted_errors()
    assert [line.split(":")[1].split()[0] for line in quoted] == ["Auto", "the", "the"] and len(quoted) == 3


def test_the_conf_files_name_the_catalogs_the_example_writes_to_with_scala_2_13_jars() -> None:
    def settings(kind: str) -> dict[str, str]:
        text = (EXAMPLE / "conf" / kind / "spark-defaults.conf").read_text()
        pairs = (line.split(None, 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))
        return {key: value.strip() for key, value in pairs}

    iceberg, delta = settings("iceberg"), settings("delta")
    assert iceberg["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    runtime = r"org\.apache\.iceberg:iceberg-spark-runtime-4\.\d+_2\.13:[\d.]+"
    assert re.fullmatch(runtime, iceberg["spark.jars.packages"])
    assert delta["spark.sql.catalog.spark_catalog"] == "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    assert delta["spark.sql.sources.default"] == "delta"
    assert re.fullmatch(r"io\.delta:delta-spark_4\.\d+_2\.13:4\.[\d.]+", delta["spark.jars.packages"])


def test_the_example_s_variables_draw_no_unknown_variable_warning() -> None:
    warnings: list[str] = []
    env = {"MCDC_SOURCE": DEV_SERVER_URI, "MCDC_DATABASE": "shop", "MCDC_COLLECTION": "users"}
    assert load_env(env, warn=warnings.append) == {"source": DEV_SERVER_URI}
    assert warnings == []


def test_the_example_spec_resolves_unqualified_names_in_spark_s_own_catalog() -> None:
    from pyspark.pipelines.cli import load_pipeline_spec

    spec = load_pipeline_spec(REPO / SPEC)
    # always there, so that Spark's graph creation cannot fail before mcdc's check speaks
    assert (spec.catalog, spec.database) == ("spark_catalog", "default")
    assert spec.configuration["mcdc.fields"] == "name STRING, age INT"


def _commands(block: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("readme", ["docs/how-to/auto-cdc.md", "examples/spark/README.md"])
def test_the_docs_and_the_spark_readme_give_the_example_s_commands_as_its_readme_does(readme: str) -> None:
    text = (REPO / readme).read_text()
    section = text[text.index("Auto CDC") if readme.startswith("docs/") else text.index("(`auto_cdc/`)") :]
    block = next(b for b in re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M) if "spark-pipelines run" in b)
    step = _commands(_steps()[0])
    assert [c for c in _commands(block) if not c.startswith("pip install")] == [c for c in step if c in block]
    assert f"spark-pipelines run --spec {SPEC}" in _commands(block)


class _Conf:
    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.settings.get(key, default)


class _Catalog:
    def __init__(self, schemas: set[str], error: Exception | None) -> None:
        self.schemas, self.error, self.asked = schemas, error, []

    def databaseExists(self, name: str) -> bool:  # Spark's name
        self.asked.append(name)
        if self.error is not None:
            raise self.error
        return name in self.schemas


class _Session:
    """What merge_catalog reads of a SparkSession: its settings and its catalog's schemas."""

    def __init__(self, settings: dict[str, str], schemas: set[str] = frozenset(), error: Exception | None = None):
        self.conf, self.catalog = _Conf(settings), _Catalog(set(schemas), error)


ICEBERG = {"spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog"}
DELTA = {"spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"}


def test_merge_catalog_takes_the_named_catalog_else_spark_s_own_replaced_by_delta() -> None:
    from replicator.spark import merge_catalog

    iceberg = _Session(ICEBERG, {"`lake`.`shop`"})
    assert merge_catalog(iceberg, "shop", "lake") == "lake" and iceberg.catalog.asked == ["`lake`.`shop`"]
    delta = _Session(DELTA, {"`spark_catalog`.`shop`"})
    assert merge_catalog(delta, "shop", "lake") == "spark_catalog"
    both = _Session({**ICEBERG, **DELTA}, {"`lake`.`shop`"})
    assert merge_catalog(both, "shop", "lake") == "lake"


def test_merge_catalog_refuses_in_one_line_what_spark_would_refuse_after_the_run_started() -> None:
    from replicator.errors import ConfigError
    from replicator.spark import merge_catalog

    with pytest.raises(ConfigError, match=r"^Auto CDC merges into its tables, and no catalog here takes MERGE: set "
                       r"spark\.sql\.catalog\.lake .* or spark\.sql\.catalog\.spark_catalog "):  # fmt: skip
        merge_catalog(_Session({}), "shop", "lake")
    with pytest.raises(ConfigError, match=r"^the schema spark_catalog\.crm does not exist: create it with spark-sql"):
        merge_catalog(_Session(DELTA, {"`spark_catalog`.`shop`"}), "crm", "lake")
    missing = RuntimeError("[CANNOT_LOAD_CATALOG.PLUGIN_CLASS_NOT_FOUND] Cannot load catalog 'lake'\n\tat ...")
    with pytest.raises(ConfigError) as raised:
        merge_catalog(_Session(ICEBERG, error=missing), "shop", "lake")
    assert str(raised.value) == (
        "the catalog lake (spark.sql.catalog.lake=org.apache.iceberg.spark.SparkCatalog) cannot be loaded: are its "
        "jars on the classpath (spark.jars.packages)? [CANNOT_LOAD_CATALOG.PLUGIN_CLASS_NOT_FOUND] Cannot load "
        "catalog 'lake'"
    )


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_the_conf_files_keep_spark_s_own_files_out_of_the_working_directory(tmp_path: Path, kind: str) -> None:
    """Issue 49: running the README left spark-warehouse/ (and a metastore, derby.log) where it ran. The conf
    files put Spark's warehouse and the SQL CLI's metastore under /tmp/mcdc-auto-cdc. Run with the conf as
    written but for its jar (no Maven Central here), on a statement that needs no catalog plugin."""
    conf = tmp_path / "conf"
    conf.mkdir()
    real = (EXAMPLE / "conf" / kind / "spark-defaults.conf").read_text()
    kept = [line for line in real.splitlines(keepends=True) if not line.startswith(("spark.jars", "spark.sql.ext"))]
    kept = [line for line in kept if "DeltaCatalog" not in line]  # the catalog class is in the jar
    # its paths moved into this test's directory: the reader's /tmp/mcdc-auto-cdc is not the test's to write
    (conf / "spark-defaults.conf").write_text("".join(kept).replace("/tmp/mcdc-auto-cdc", str(tmp_path / "state")))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = _environment(SPARK_CONF_DIR=str(conf), PYSPARK_PYTHON=sys.executable)
    done = subprocess.run(
        ["spark-sql", "-e", "CREATE NAMESPACE IF NOT EXISTS mcdc_trace; SELECT 1"], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in cwd.iterdir()) == []
    assert (tmp_path / "state").is_dir()  # where they went
