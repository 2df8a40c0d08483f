"""The README's Layout section lists every module, script and config of the tree, and nothing else."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layout_paths() -> set[str]:
    """Paths named in the README's Layout code block, rebuilt from the indentation (two spaces a level)."""
    text = ROOT.joinpath("README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    stack: list[str] = []
    paths = set()
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        stack = stack[:depth] + [name]
        if not name.endswith("/"):
            paths.add("".join(stack))
    return paths


def test_readme_layout_matches_the_tree():
    tree = {str(p.relative_to(ROOT)) for p in (ROOT / "annotated_transformer").rglob("*.py")}
    tree |= {str(p.relative_to(ROOT)) for p in (ROOT / "scripts").glob("*.py")}
    tree |= {str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*.yaml")}
    listed = {p for p in layout_paths() if p.endswith((".py", ".yaml"))}
    assert tree - listed == set(), "in the tree but not in the README's Layout"
    assert listed - tree == set(), "in the README's Layout but not in the tree"


# Lower layers never import higher ones; data and model, on one layer, never import each other.
LAYERS = {
    "errors": 0, "files": 0, "masks": 0, "fast_dropout": 0,
    "config": 1, "device": 1, "distributed": 1, "monitor": 1, "tensorboard_log": 1,
    "data": 2, "model": 2, "loss": 2, "optim": 2,
    "checkpoint": 3, "ct2_export": 3, "decoding": 3, "evaluation": 3, "run_dir": 3,
    "tasks": 4, "translator": 4, "ct2_translator": 4,
    "training": 5, "benchmark": 5, "engine_benchmark": 5, "visualization": 5,
    "sweep": 6, "sweep_report": 6,
}
APART = {"data", "model"}


def relative_imports(path: Path, package: Path):
    """(importing top-level module, imported top-level module) for every relative import in `path`."""
    parts = list(path.relative_to(package).with_suffix("").parts)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            target = parts[: len(parts) - node.level] + (node.module.split(".") if node.module else [])
            names = [a.name for a in node.names] if not target else [target[0]]
            for name in names:
                yield parts[0], name


def test_no_module_imports_a_higher_layer():
    package = ROOT / "annotated_transformer"
    modules = {p.stem if p.parent == package else p.relative_to(package).parts[0]
               for p in package.rglob("*.py") if p != package / "__init__.py"}
    assert modules <= set(LAYERS), f"give these modules a layer: {modules - set(LAYERS)}"
    wrong = []
    for path in package.rglob("*.py"):
        if path == package / "__init__.py":
            continue  # the public API gathers every layer
        for me, target in relative_imports(path, package):
            if target != me and (LAYERS[target] > LAYERS[me] or {me, target} == APART):
                wrong.append(f"{path.relative_to(package)} imports {target}")
    assert wrong == []
