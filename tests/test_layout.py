"""docs/layout.md's Layout section lists every module, script and config of the tree, and nothing else; the
modules import only lower layers; the README's reading order names core files with their line counts."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def layout_paths() -> set[str]:
    """Paths named in docs/layout.md's Layout code block, rebuilt from the indentation (two spaces a level)."""
    text = ROOT.joinpath("docs", "layout.md").read_text(encoding="utf-8")
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


def test_layout_doc_matches_the_tree():
    tree = {str(p.relative_to(ROOT)) for p in (ROOT / "annotated_transformer").rglob("*.py")}
    tree |= {str(p.relative_to(ROOT)) for p in (ROOT / "scripts").glob("*.py")}
    tree |= {str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*.yaml")}
    listed = {p for p in layout_paths() if p.endswith((".py", ".yaml"))}
    # a wildcard row (extensions/*.py) stands for the files it matches that have no row of their own
    patterns = {p for p in listed if "*" in p}
    listed = (listed - patterns) | {str(p.relative_to(ROOT)) for pattern in patterns for p in ROOT.glob(pattern)}
    assert tree - listed == set(), "in the tree but not in docs/layout.md's Layout"
    assert listed - tree == set(), "in docs/layout.md's Layout but not in the tree"


# Lower layers never import higher ones; data and model, on one layer, never import each other.
# Layers 0-3 hold the core (what `import annotated_transformer` loads: CORE_HELPERS and the README's reading order,
# below) and what is loaded on first use beside it (config and the extensions, fast/, the data loaders); the harness
# and the tools sit above.
LAYERS = {
    "runtime": 0,  # errors, files, device, model_flops: what every part runs on
    "masks": 0,
    "attention": 1,
    "sections": 1,  # the config's core sections and Extension: what the data and every extension module import
    "data": 2, "model": 2, "loss": 2, "optim": 2,
    "fast": 3,  # speed installed on the core's classes from outside: imports the loss, never imported by the core
    "loop": 3, "decoding": 3,
    "config": 3,  # Config: the core sections, then each extension's (it loads every extension module)
    "decode": 4,  # beam search and batched decoding: above the core's greedy_decode and fast/'s oneDNN linears
    "extensions.builder": 5,  # every other module of extensions/ is an extension, on EXTENSION_LAYER (below)
    "checkpoints": 4,  # the model-file and checkpoint formats: below both the harness and deploy/
    "harness.distributed": 4, "harness.monitor": 4, "harness.tensorboard_log": 4,
    "harness.schedules": 4, "harness.malloc": 4, "harness.loss_meter": 4, "harness.train_loop": 5,
    "scoring": 4, "deploy.text_translator": 4, "deploy.ct2_export": 4, "lab.hardware": 4, "lab.graphed_step": 4,
    "lab.synthetic_corpus": 4,
    "lab.product_benchmark": 5,
    "harness.checkpointer": 6,
    "harness.run_dir": 5, "harness.resume": 5, "harness.metrics": 5, "deploy.ct2_translator": 5,
    "deploy.attention": 5,
    "harness.tasks": 6, "deploy.translator": 6, "visualization": 6,
    "harness.progress": 7, "harness.run_end": 7, "lab.benchmark": 7, "lab.engine_benchmark": 7,
    "lab.extension_benchmark": 7, "lab.shape_benchmark": 7, "lab.step_profile": 7, "lab.seed_statistics": 7,
    "harness.trainer": 8, "lab.sweep": 8, "lab.speed_report": 8, "lab.gpu_check": 8, "lab.scale_benchmark": 8,
    "__init__": 9, "cli": 9, "__main__": 10,  # __init__: the public API, as imported by name from the package
}
# Every extension module sits on one layer, below config, which loads them all: a new one needs no line here.
EXTENSION_LAYER = 3
LAYERS |= {f"extensions.{p.stem}": EXTENSION_LAYER for p in (ROOT / "annotated_transformer" / "extensions").glob("*.py")
           if f"extensions.{p.stem}" not in LAYERS}
CORE = {name for name, layer in LAYERS.items() if layer <= 3}
APART = {"data", "model"}


# Subpackages whose files LAYERS places one by one; every other subpackage has one layer as a whole.
BY_FILE = ("harness", "extensions", "deploy", "lab")


def module_key(parts: list[str]) -> str:
    """A module's name in LAYERS: harness/, extensions/, deploy/ and lab/ file by file, other subpackages whole."""
    return ".".join(parts[:2]) if parts[0] in BY_FILE and len(parts) > 1 else parts[0]


def relative_imports(path: Path, package: Path, typing_too: bool = False):
    """(importing module, imported module) for every relative import in `path`, named as in LAYERS; with
    `typing_too`, those under TYPE_CHECKING as well."""
    parts = list(path.relative_to(package).with_suffix("").parts)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(block)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and (typing_too or id(node) not in typing_only):
            target = parts[: len(parts) - node.level] + (node.module.split(".") if node.module else [])
            names = [target + [a.name] for a in node.names] if len(target) < 2 else [target]
            # `from .. import __version__`: a name of the package's own __init__, not a module.
            names = [["__init__"] if len(n) == 1 and not (package / n[0]).is_dir()
                     and not (package / f"{n[0]}.py").is_file() else n for n in names]
            for name in names:
                yield module_key(parts), module_key(name)


def test_no_module_imports_a_higher_layer():
    package = ROOT / "annotated_transformer"
    files = [p for p in package.rglob("*.py")
             if p not in (package / "__init__.py", *(package / sub / "__init__.py" for sub in BY_FILE))]
    modules = {module_key(list(p.relative_to(package).with_suffix("").parts)) for p in files}
    assert modules <= set(LAYERS), f"give these modules a layer: {modules - set(LAYERS)}"
    wrong = []
    for path in files:
        for me, target in relative_imports(path, package):
            if target != me and (LAYERS[target] > LAYERS[me] or {me, target} == APART):
                wrong.append(f"{path.relative_to(package)} imports {target}")
    assert wrong == []


def test_no_import_cycles():
    """No module reaches itself through its imports: at the top, inside functions or under TYPE_CHECKING."""
    package = ROOT / "annotated_transformer"
    edges: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for me, target in relative_imports(path, package, typing_too=True):
            if me != target:
                edges.setdefault(me, set()).add(target)

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    assert sorted(me for me in edges if me in reachable(me)) == []


def test_the_core_imports_nothing_of_the_harness():
    package = ROOT / "annotated_transformer"
    wrong = [f"{me} imports {target}" for path in package.rglob("*.py") if path.parent.name != "harness"
             for me, target in relative_imports(path, package) if me in CORE and target not in CORE]
    assert wrong == []


def test_the_harness_imports_neither_the_lab_nor_deploy():
    """What training needs at run time (the machine's name, decoding a split) lives below it, in the core."""
    package = ROOT / "annotated_transformer"
    wrong = [f"{me} imports {target}" for path in (package / "harness").glob("*.py")
             for me, target in relative_imports(path, package) if target.split(".")[0] in ("lab", "deploy")]
    assert wrong == []


# What `import annotated_transformer` loads of the package besides the README's reading order: the packages around
# its files, and autocast. Config (and with it every extension), fast/, decode/, the data loaders, the harness,
# deploy/ and lab/ load when first asked for.
CORE_HELPERS = {"annotated_transformer", "annotated_transformer.runtime", "annotated_transformer.runtime.precision",
                "annotated_transformer.runtime.lazy", "annotated_transformer.data"}
NOT_CORE = tuple(f"annotated_transformer.{name}" for name in (
    "fast", "decode", "extensions", "harness", "lab", "deploy", "config", "data.loader", "data.buckets",
    "data.translation_data", "data.cache", "data.text", "data.vocab", "data.tokenizers", "data.multi30k",
    "data.own_files", "data.ids", "data.tokenise", "data.copy_loader", "data.notebook_pipeline", "runtime.device"))

# In a fresh process: what the package import loads, then each reading-order file, then the names loaded on use.
IMPORTS = """
import json, sys, threading, torch
ours = lambda: sorted(m for m in sys.modules if m.split('.')[0] == 'annotated_transformer')
HEAVY = {'tqdm', 'torchdata', 'sacrebleu', 'spacy', 'altair', 'vl_convert', 'pynvml', 'sentencepiece'}
heavy = lambda: {m.split('.')[0] for m in sys.modules} & HEAVY
before = heavy()
import annotated_transformer as at
seen = {'package': ours(), 'heavy': sorted(heavy() - before), 'threads': threading.active_count()}
for name in json.loads(sys.argv[1]):
    __import__(name)
seen['reading_order'] = ours()
import annotated_transformer.data as data
seen['on_use'] = [at.Config.__module__, at.load_config.__module__, at.beam_search.__module__,
                  at.decode_batch.__module__, at.train_worker.__module__, data.load_translation_data.__module__]
import annotated_transformer.visualization as viz
charts = lambda: sorted({m.split('.')[0] for m in sys.modules} & {'altair', 'vl_convert'})
seen['charts'] = charts()
viz.mask_chart
seen['after_a_chart'] = charts()
print(json.dumps(seen))
"""


def reading_order_modules() -> list[str]:
    """The README's reading-order files inside the package, as module names."""
    rows, _ = reading_order()
    paths = [row[1].strip().strip("`") for row in rows]
    return [p.removesuffix(".py").replace("/", ".") for p in paths if p.startswith("annotated_transformer/")]


@pytest.mark.slow  # a fresh process (importing torch alone takes 1.5 s)
def test_importing_the_package_loads_the_core_only():
    """The README's claim: `import annotated_transformer` loads its reading order and CORE_HELPERS, nothing else of
    the package, and importing any file of the reading order then loads nothing more (in a fresh process a file's
    import runs the package's first, so this is what each file alone loads). Nothing heavy beyond what `import
    torch` loads itself (torch 2.15 brings tqdm and pynvml), and no thread. Config, the decoders beyond the
    notebook's, train_worker and the data loaders load their modules on first use; the visualization package
    loads altair on its first chart, and vl-convert only to save a PNG."""
    modules = reading_order_modules()
    out = subprocess.run([sys.executable, "-c", IMPORTS, json.dumps(modules)], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert [m for m in seen["package"] if m.startswith(NOT_CORE)] == []
    assert set(seen["package"]) == set(modules) | CORE_HELPERS
    assert seen["reading_order"] == seen["package"]
    assert seen["heavy"] == [] and seen["threads"] == 1
    assert seen["on_use"] == ["annotated_transformer.config.schema", "annotated_transformer.config.loading",
                              "annotated_transformer.decode.beam_search", "annotated_transformer.decode.inference",
                              "annotated_transformer.harness.trainer", "annotated_transformer.data.translation_data"]
    assert seen["charts"] == [] and seen["after_a_chart"] == ["altair"]


def reading_order() -> tuple[list[list[str]], str]:
    """The README's reading-order table (rows of cells) and the command under it that counts its lines."""
    section = ROOT.joinpath("README.md").read_text(encoding="utf-8").split("## Reading order", 1)[1]
    table = section.split("\n\n")[2]
    command = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    return [line.split("|") for line in table.splitlines()[2:]], command


def test_reading_order_names_core_files_with_their_line_counts():
    rows, _ = reading_order()
    assert len(rows) >= 7
    assert rows[-1][1].strip() == "`examples/copy_task.py`"  # the notebook's example_simple_model comes last
    for row in rows:
        path, lines = row[1].strip().strip("`"), int(row[-2])
        module = path.removeprefix("annotated_transformer/").split("/")[0].removesuffix(".py")
        assert module in CORE or path == "examples/copy_task.py", path
        actual = len(ROOT.joinpath(path).read_text(encoding="utf-8").splitlines())
        assert abs(actual - lines) <= 0.1 * actual, f"{path}: the README says {lines} lines, it has {actual}"


def test_the_reading_order_is_at_most_800_lines_by_the_readmes_own_command():
    rows, command = reading_order()
    assert command.startswith("wc -l ")
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    counted = {line.split()[1]: int(line.split()[0]) for line in out.splitlines() if line.split()[1] != "total"}
    assert list(counted) == [row[1].strip().strip("`") for row in rows]  # the command counts the table's files
    total = int(out.splitlines()[-1].split()[0])
    assert total == sum(counted.values()) <= 800, f"the reading order has {total} lines; keep it at most 800"


def test_the_papers_classes_name_no_extension():
    """attention.py and model.py know the extensions only through their seam (hooks, subclasses)."""
    names = ("merg", "prun", "guide", "local_window", "local attention", "scheduled", "token_")
    for path in ("attention.py", "model.py"):
        text = ROOT.joinpath("annotated_transformer", path).read_text(encoding="utf-8").lower()
        assert [n for n in names if n in text] == [], path


def test_every_public_name_resolves_and_the_two_counters_share_no_field():
    """Each name of the package's __all__ comes from its module (the lazy ones on first use), and the loop's
    TrainState and the harness's RunCounters, saved as one flat dict in last.pt, never name the same field."""
    from dataclasses import fields

    import annotated_transformer
    from annotated_transformer.harness.resume import RunCounters

    assert [name for name in annotated_transformer.__all__ if not hasattr(annotated_transformer, name)] == []
    assert {f.name for f in fields(annotated_transformer.TrainState)} & {f.name for f in fields(RunCounters)} == set()
