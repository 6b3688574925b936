"""The documentation: a short README that leads to the docs' pages, and an options reference made from the
option table, so that neither can drift. (``mkdocs build --strict`` in scripts/test.sh checks every link,
anchor and the navigation; tests/test_readme.py runs the pages' shell examples.)"""

from __future__ import annotations

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
