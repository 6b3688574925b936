"""The documentation: a short README that leads to the docs' pages, and an options reference made from the
option table, so that neither can drift. (``mkdocs build --strict`` in scripts/test.sh checks every link,
anchor and the navigation; tests/test_readme.py runs the pages' shell examples.)"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import itertools
import re
from pathlib import Path
from types import ModuleType

import yaml

from replicator.settings.options import OPTIONS
from replicator.settings.reference import options_markdown

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _readme_links() -> list[str]:
    return re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())


def test_the_readme_is_at_most_150_lines() -> None:
    assert len(README.read_text().splitlines()) <= 150


def test_the_readme_s_links_lead_to_files_that_exist() -> None:
    local = [link for link in _readme_links() if "://" not in link]
    assert local and [link for link in local if not (ROOT / link).is_file()] == []


def test_the_readme_links_to_the_sync_tail_cutover_kafka_lake_and_spark_pages() -> None:
    pages = {
        "docs/reference/commands/sync.md",
        "docs/reference/commands/tail.md",
        "docs/reference/commands/cutover.md",
        "docs/how-to/migrate-a-cluster.md",
        "docs/how-to/kafka.md",
        "docs/how-to/lake.md",
        "docs/how-to/spark.md",
    }
    assert pages - set(_readme_links()) == set()


def test_every_page_is_in_the_navigation_and_the_build_runs_the_options_hook() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.SafeLoader)
    assert config["hooks"] == ["scripts/docs_hooks.py"] and config["strict"] is True
    named = set(re.findall(r"[\w/-]+\.md", str(config["nav"])))
    assert named == {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}


def test_the_options_page_is_made_from_the_option_table_with_every_option() -> None:
    page = (DOCS / "reference" / "options.md").read_text()
    assert "{{ options }}" in page
    built = _hooks().on_page_markdown(page)
    assert "{{ options }}" not in built and options_markdown() in built
    for option in OPTIONS:
        row = next(line for line in built.splitlines() if line.startswith(f"| `{option.flag}`"))
        assert f"`{option.env}`" in row and row.count(f"`{option.name}`") == 2  # TOML key and Spark option


def test_an_option_s_row_gives_its_default_choices_and_help_escaped_for_markdown() -> None:
    rows = {line.split(" | ")[0]: line for line in options_markdown().splitlines() if line.startswith("| `--")}
    assert "| `1000` |" in rows["| `--max-batch-size`"]
    assert "| `initial` |" in rows["| `--snapshot`"] and "`when_needed`" in rows["| `--snapshot`"]
    assert "| off |" in rows["| `--drop-target`"] and "| on |" in rows["| `--progress`"]
    assert "| `120` |" in rows["| `--retry-max-delay`"]  # a float shown as --help shows it
    assert r"shop\\.orders" in rows["| `--filter`"]  # a backslash of the help survives Markdown
    assert rows["| `--source`, `-s`"].count(" | ") == 6  # seven cells, whatever the help holds


def _prose(page: Path) -> list[str]:
    """A page's lines outside code blocks (a fenced block's lines are blank here)."""
    lines, fenced = [], False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else line)
    return lines


def test_every_list_renders_as_a_list_and_the_long_pages_have_headings() -> None:
    """A Markdown list right after a paragraph line is that paragraph's run-on text (issue 49: the least
    privilege page's two lists); a long page without subheadings has no table of contents."""
    item = re.compile(r"^(- |\* |\d+\. )")
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        lines = _prose(page)
        for before, line in itertools.pairwise(lines):
            glued = item.match(line) and before.strip() and not item.match(before) and not before.startswith(" ")
            assert not glued, f"{page.name}: a list after a paragraph line, with no blank line: {line[:60]!r}"
        if len(lines) > 80 and page != README:
            assert any(line.startswith("## ") for line in lines), f"{page.name}: a long page without headings"


#: The Python blocks of README.md and docs/, by their first line: which test runs each, or why none does.
PYTHON_BLOCKS = {
    "import duckdb": "tests/test_lake.py runs it as written, on a state table mcdc wrote",
    "from replicator.lakeflow import MongoLakeflowConnect": "tests/test_lakeflow.py runs it as written",
    "from pyspark.sql import SparkSession": "not run as a block: it needs a source, a target and a SparkSession on "
    "them at once; tests/test_spark_datasource.py runs each of its reads and writes",
}


def _python_blocks() -> list[tuple[Path, str]]:
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    return [(page, block) for page in pages for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]


def _unbound(block: str) -> set[str]:
    """The names a block uses that it neither imports nor assigns (nor are Python's own)."""
    tree = ast.parse(block)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return used - bound


def test_every_python_block_defines_what_it_uses_and_is_run_or_says_why_not() -> None:
    """Issue 49: snippets used spark, SRC, DST, CP and duckdb without defining or importing them."""
    blocks = _python_blocks()
    assert blocks
    for page, block in blocks:
        assert _unbound(block) == set(), f"{page.name}: a Python block uses {sorted(_unbound(block))} undefined"
        first = block.splitlines()[0]
        assert any(first.startswith(p) for p in PYTHON_BLOCKS), f"{page.name}: {first!r} neither run nor listed"


def test_every_page_whose_commands_use_src_and_dst_says_what_they_are() -> None:
    """``$SRC``/``$DST`` in a page's commands: the page sets them, says in its text what they are (`$SRC`
    named outside its code blocks), or links to where they are set."""
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        text = page.read_text()
        commands = "".join(re.findall(r"```bash\n(.*?)```", text, re.S))
        prose = "\n".join(_prose(page))
        if re.search(r"\$(SRC|DST)\b", commands):
            said = re.search(r"^SRC=", text, re.M) or "`$SRC`" in prose or "first-migration.md" in text
            assert said, f"{page.name}: its commands use $SRC/$DST, and it does not say what they are"
