"""The packages form layers, and every import points down (or stays inside its package).

Run alone: ``python -m pytest tests/test_layers.py``. It reads every ``import`` in replicator/ (module level,
inside functions, and under TYPE_CHECKING alike) and names each arrow that points up or sideways."""

from __future__ import annotations

import ast
from pathlib import Path

import replicator

ROOT = Path(replicator.__file__).parent

#: Lowest first. A package may import its own modules and any package of a lower layer. Packages in one
#: layer do not import each other: the two engines are siblings.
LAYERS: list[set[str]] = [
    {"replicator", "errors", "bsonkit"},
    {"events", "query"},
    {"settings"},
    {"observe"},
    {"checkpoint"},
    {"source"},
    {"sinks"},
    {"snapshot"},
    {"replay"},
    {"checking"},
    {"engines"},
    {"engines.asyncio", "engines.spark"},
    {"job"},
    {"spark_datasource"},
    {"lakeflow"},
    {"spark"},
    {"cli"},
]
_LAYER = {name: n for n, names in enumerate(LAYERS) for name in names}


def _package(module: str) -> str:
    """The layer unit a dotted module belongs to: its longest prefix named in LAYERS."""
    parts = module.split(".")[1:]  # without "replicator"
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in _LAYER:
            return ".".join(parts[:k])
    return "replicator"


def _module_of(path: Path) -> str:
    parts = ["replicator", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> set[str]:
    me = _module_of(path).split(".")
    if path.name != "__init__.py":
        me = me[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "replicator"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(me[: len(me) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] == "replicator":
                # ``from replicator.x import y`` may name the module x.y: count the deeper unit where there is one
                found |= {f"{base}.{a.name}" for a in node.names}
    return found


def arrows_against_the_layers() -> list[str]:
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        mine = _package(_module_of(path))
        for target in sorted(_imported(path)):
            theirs = _package(target)
            if theirs == mine or _package(target.rsplit(".", 1)[0]) == mine:
                continue
            if _LAYER[theirs] > _LAYER[mine] or (_LAYER[theirs] == _LAYER[mine] and theirs != "replicator"):
                wrong.append(f"{path.relative_to(ROOT.parent)} ({mine}) imports {target} ({theirs})")
    return wrong


def test_every_package_is_in_a_layer() -> None:
    packages = {p.parent.relative_to(ROOT).as_posix().replace("/", ".") for p in ROOT.rglob("__init__.py")}
    top = {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    unplaced = {name for name in (packages | top) - {"."} if _package(f"replicator.{name}") == "replicator"}
    assert not unplaced, f"not in any layer of LAYERS: {sorted(unplaced)}"


def test_no_import_points_up_or_across_the_layers() -> None:
    wrong = arrows_against_the_layers()
    assert not wrong, "\n".join(wrong)


def _architecture_tree() -> list[str]:
    """The top-level names the architecture page's block lists, in its order."""
    text = (ROOT.parent / "docs" / "explanation" / "architecture.md").read_text()
    block = text[text.index("# Architecture") :].split("```")[1]
    return [
        line.split()[0].rstrip("/").removesuffix(".py")
        for line in block.splitlines()
        if line.startswith("  ") and not line.startswith("   ") and line.strip()
    ]


def test_the_architecture_page_lists_every_package_once_lowest_layer_first() -> None:
    listed = _architecture_tree()
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    modules = {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    assert sorted(listed) == sorted(packages | modules)
    layers = [_LAYER[name] for name in listed]
    assert layers == sorted(layers), f"the architecture page's order is not the layers': {listed}"


if __name__ == "__main__":
    print("\n".join(arrows_against_the_layers()) or "no arrow against the layers")
