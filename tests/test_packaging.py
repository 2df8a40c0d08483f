"""Installed use and light imports.

The wheel carries every module and the shipped configs; installed outside the checkout it finds
`python -m annotated_transformer train --config copy.yaml` from any folder and trains; it declares the
`annotated-transformer` console command. The package imports, and trains tiny.yaml from a
prepared data cache, on a machine without spaCy, altair and vl-convert. install.md's CPU-only install
takes torch from PyTorch's CPU index and the rest from the lock, without CUDA's libraries.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from annotated_transformer.config import load_config, resolve_config_path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "annotated_transformer"
SHIPPED = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
# What uv prints when it cannot reach the package index (the build needs setuptools from it).
NETWORK_ERRORS = ("failed to fetch", "error sending request", "dns error", "connect error", "network is unreachable")


def _uv() -> list[str]:
    if shutil.which("uv"):
        return ["uv"]
    if importlib.util.find_spec("uv"):  # pip install uv without its script on PATH
        return [sys.executable, "-m", "uv"]
    pytest.skip("uv is not installed (pip install uv)")


def _run(cmd: list[str], timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)


def _build_wheel(tmp: Path) -> Path:
    """Build the wheel from a copy of the sources (the checkout's build/ and egg-info stay untouched)."""
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / PACKAGE, src / PACKAGE, ignore=ignore)
    shutil.copytree(ROOT / "configs", src / "configs")
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    out = tmp / "dist"
    build = [*_uv(), "build", "--wheel", "--out-dir", out, "--python", sys.executable, "--no-progress", src]
    # uv's cache first (setuptools is usually there, no network needed), then the package index.
    env = dict(os.environ, UV_HTTP_TIMEOUT="20")
    offline = _run([*build, "--offline"], env=env)
    done = offline if offline.returncode == 0 else _run(build, env=env)
    if done.returncode != 0:
        log = done.stdout + done.stderr
        if any(marker in log.lower() for marker in NETWORK_ERRORS):
            pytest.skip("cannot build the wheel: setuptools is neither in uv's cache nor reachable "
                        f"({log.strip()[-300:]})")
        pytest.fail(f"uv build failed:\n{log}")
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.slow
def test_wheel_ships_every_module_and_config_and_trains_copy_outside_the_checkout(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / PACKAGE).rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(modules - names)
    assert not missing, f"the wheel lacks {missing}: does each subpackage have an __init__.py? (setup.py)"
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith(f"{PACKAGE}/configs/")} == set(SHIPPED)

    site = tmp_path / "site"
    done = _run([*_uv(), "pip", "install", "--no-deps", "--offline", "--python", sys.executable,
                 "--target", site, wheel])
    assert done.returncode == 0, done.stdout + done.stderr
    elsewhere = tmp_path / "elsewhere"  # outside the checkout, with no configs/ of its own
    elsewhere.mkdir()
    # The installed copy comes first on sys.path; the checkout's editable install is only a fallback
    # finder behind it, and the probe proves it is not the one used. Then the README's command runs,
    # from another folder, in the same process.
    run_dir = tmp_path / "run"
    done = _run([sys.executable, "-c", """if True:
        import json, runpy, sys, annotated_transformer
        from annotated_transformer.config import load_config, resolve_config_path
        from annotated_transformer.runtime.errors import ConfigError
        try:
            load_config("nope")
        except ConfigError as exc:
            error = str(exc) + "\\n" + "\\n".join(exc.details)
        print(json.dumps({"package": annotated_transformer.__file__, "base": str(resolve_config_path("base")),
                          "error": error}))
        sys.argv = ["annotated_transformer", *sys.argv[1:]]  # python -m annotated_transformer train --config ...
        runpy.run_module("annotated_transformer", run_name="__main__", alter_sys=True)
    """, "train", "--config", "copy.yaml", "train.epochs=1", "data.copy_batches=2",
                 f"train.out_dir={run_dir}", "train.device=cpu", "train.progress=false"],
                cwd=elsewhere, env=dict(os.environ, PYTHONPATH=str(site)))
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.splitlines()[0])
    assert Path(found["package"]).is_relative_to(site)
    assert Path(found["base"]) == site / PACKAGE / "configs" / "base.yaml"
    assert found["error"].startswith("config file 'nope' not found; give a config's name (listed below)")
    assert all(f"\n  {Path(n).stem} " in found["error"] for n in SHIPPED)  # the installed package lists its own
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    commands = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "annotated-transformer = annotated_transformer.cli:console_main" in commands  # pip install . adds it
    assert (run_dir / "last.pt").is_file() and (run_dir / "config.yaml").is_file()
    assert "exact copies:" in done.stdout


def test_configs_in_the_current_folder_win_and_shipped_ones_are_found_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path("base") == ROOT / "configs" / "base.yaml"  # a checkout: its configs/
    (tmp_path / "configs").mkdir()
    own = "data:\n  dataset: copy\nmodel:\n  N: 1\ntrain:\n  best_metric: loss\n"
    (tmp_path / "configs" / "copy.yaml").write_text(own, encoding="utf-8")
    assert resolve_config_path("copy") == Path("configs") / "copy.yaml"
    assert load_config("copy.yaml").model.N == 1
    assert load_config("tiny").name == "tiny"  # not in ./configs: the shipped one


CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's index of CPU-only torch builds


def _name(requirement: str) -> str:
    """The normalised package name a requirement starts with ('Vl_Convert-Python>=1.6' gives 'vl-convert-python')."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group()).lower()


def cpu_only_recipe() -> list[list[str]]:
    """The commands of install.md's CPU-only install (the section's first bash block), split as a shell splits them."""
    section = (ROOT / "docs" / "install.md").read_text(encoding="utf-8").split("\n## CPU-only install\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def test_the_cpu_only_recipe_takes_torch_from_the_cpu_index_and_the_rest_from_the_lock(tmp_path):
    """install.md's CPU-only commands: torch from PyTorch's CPU index before the project, which would otherwise pull
    the lock's CUDA build; then the lock's export without torch, run here as written, holds every other dependency
    (the dev group's test tools too) and nothing of CUDA."""
    recipe = cpu_only_recipe()
    torch_step = next(c for c in recipe if c[:3] == ["uv", "pip", "install"] and "torch" in c)
    project_step = next(c for c in recipe if c[:3] == ["uv", "pip", "install"] and "-e" in c)
    export = next(c for c in recipe if c[:2] == ["uv", "export"])
    assert torch_step[torch_step.index("--index-url") + 1] == CPU_INDEX
    assert recipe.index(torch_step) < recipe.index(project_step)
    listed = export[export.index("-o") + 1]
    assert project_step[project_step.index("-r") + 1] == listed  # the project step installs what the export lists

    out = tmp_path / "requirements.txt"
    done = _run([*_uv(), *[out if arg == listed else arg for arg in export[1:]]], cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    names = {_name(line) for line in out.read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.lstrip().startswith(("#", "-"))}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    needed = {_name(r) for r in [*project["project"]["dependencies"], *project["dependency-groups"]["dev"]]}
    assert "torch" in needed and needed - names == {"torch"}
    cuda = {n for n in names - needed if n == "triton" or n.startswith(("nvidia-", "cuda-"))}
    assert cuda == set(), "these would bring CUDA back into the CPU-only environment"


# Pretends spaCy, altair and vl-convert are not installed: no import, no distribution metadata.
BLOCK_PRELUDE = """if True:
    import importlib.metadata, sys
    BLOCKED = {"spacy", "altair", "vl_convert"}

    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (the test hides it)", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    _version = importlib.metadata.version

    def version(name):
        if name.lower().replace("-", "_") in BLOCKED | {"vl_convert_python"}:
            raise importlib.metadata.PackageNotFoundError(name)
        return _version(name)

    importlib.metadata.version = version
"""

# After the prelude: imports, a word-mode tokenisation, prepare-data --json on the warm cache, then
# `python -m annotated_transformer train ARGS`; what it finds is printed as "@tag json" lines.
WITHOUT_THE_HEAVY_PACKAGES = BLOCK_PRELUDE + """
    import contextlib, io, json, runpy

    def tell(tag, value):
        print("@" + tag, json.dumps(value), flush=True)

    import annotated_transformer, annotated_transformer.data, annotated_transformer.deploy.translator
    tell("imported", sorted(m for m in ("spacy", "altair", "vl_convert", "torchdata") if m in sys.modules))
    from annotated_transformer.data.tokenizers import word_tokenize
    from annotated_transformer.runtime.errors import UserError
    try:  # tokenising text (building a word-mode cache, translating a sentence) does need spaCy
        word_tokenize("Ein Mann.", "de")
    except UserError as exc:
        tell("tokenize", str(exc))
    from annotated_transformer.cli import run
    prepare, train = sys.argv[1:sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1:]
    stats = io.StringIO()
    with contextlib.redirect_stdout(stats):
        try:
            run("prepare-data", prepare, "prepare_data.py")
        except SystemExit as exc:
            code = exc.code
    tell("prepared", {"code": code, "stats": stats.getvalue(),
                      "loaded": sorted(m for m in ("spacy", "sentencepiece") if m in sys.modules)})
    sys.argv = ["annotated_transformer", *train]  # python -m annotated_transformer train --config ...
    try:
        runpy.run_module("annotated_transformer", run_name="__main__", alter_sys=True)
    finally:
        tell("trained", sorted(m for m in BLOCKED if m in sys.modules))
"""


@pytest.mark.slow
def test_without_spacy_altair_vl_convert_the_package_imports_and_tiny_trains_from_a_prepared_cache(
        multi30k_dir, data_cache_dir, multi30k_data, tmp_path):
    """One interpreter where spaCy, altair and vl-convert are not installed: the package imports without them (nor
    torchdata); tokenising text asks for spaCy in one line; prepare-data reads the warm cache without spaCy or
    sentencepiece; tiny.yaml trains from that cache, val BLEU included."""
    # multi30k_data built the word-mode tiny cache with spaCy; this process has neither it nor its version.
    data = [f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}"]
    run_dir = tmp_path / "run"
    done = _run([sys.executable, "-c", WITHOUT_THE_HEAVY_PACKAGES, "--config", "tiny", *data, "--json", "--",
                 "train", "--config", "tiny.yaml", *data, f"train.out_dir={run_dir}", "train.max_steps=20",
                 "train.log_every=10", "train.final_eval=false", "train.progress=false", "train.device=cpu",
                 "train.bleu_every=1", "decode.max_len_a=5"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    told = {line.split(" ", 1)[0][1:]: json.loads(line.split(" ", 1)[1])
            for line in done.stdout.splitlines() if line.startswith("@")}
    assert told["imported"] == []
    assert told["tokenize"].startswith("word-mode text (data.tokenizer=word) is tokenised with spaCy, which is not "
                                       "installed")
    prepared = told["prepared"]
    assert prepared["code"] == 0 and prepared["loaded"] == []
    stats = json.loads(prepared["stats"])  # stdout was exactly one JSON object
    assert stats["splits"] == {"train": 29000, "val": 1014, "test": 1000}
    assert stats["vocab"] == {"src": len(multi30k_data.text.src_vocab), "tgt": len(multi30k_data.text.tgt_vocab)}
    assert stats["padding_fraction"] == pytest.approx(multi30k_data.stats["padding_fraction_bucket"])
    assert stats["cache_hit"] is True and stats["built"] is False  # read back: nothing tokenised
    assert "loaded from cache" in done.stdout
    assert "val BLEU" in done.stdout  # the cache's tokenised references: BLEU needs no spaCy either
    assert (run_dir / "last.pt").is_file() and (run_dir / "metrics.jsonl").is_file()
    assert told["trained"] == []
