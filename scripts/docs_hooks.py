"""MkDocs hooks (mkdocs.yml's ``hooks:``): the options reference page is made from the option table at build
time, so that it cannot drift from it. A page says ``{{ options }}`` where the table goes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# this checkout's option table, whichever mcdc the Python running mkdocs has installed
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replicator.settings.reference import options_markdown

MARKER = "{{ options }}"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Put the option table where a page asks for it."""
    return markdown.replace(MARKER, options_markdown()) if MARKER in markdown else markdown
