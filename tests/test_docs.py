"""The docs are written for users: results.md is one page of tables, no page outside docs/lab/ names a
commit or an issue, the README's first screen reaches a translation and links the notebook."""

import re
from pathlib import Path

import pytest

from annotated_transformer.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LAB = DOCS / "lab"  # the appendix: the measurement history, where dates and versions of the code belong
NOTEBOOK = "notebooks/attention_visualization.ipynb"

# A commit hash as one writes it: 7 to 40 lowercase hex digits standing alone as a word, with at least one
# digit and one letter (so plain numbers such as 1048576 and hex-only words such as "decade" pass). A sha256
# checksum (64 hex digits) is longer than any written hash, so the word boundaries keep it from matching.
COMMIT = re.compile(r"(?<![\w-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
# "issue 37", "Issues 12", "issue #37": a tracker the reader cannot see (owner/repo#N of a public project is fine).
ISSUE = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


def user_pages() -> list[Path]:
    """Every text file under docs/ outside the appendix."""
    pages = []
    for path in sorted(DOCS.rglob("*")):
        if not path.is_file() or path.is_relative_to(LAB):
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a chart (PNG) holds no prose
            continue
        pages.append(path)
    return pages


def test_the_rules_catch_hashes_and_issue_numbers_only():
    flagged = ["commit 2598f5e,", "code of 0b48add (seed 1)", "git show 1ce0f8e:configs/base.yaml",
               "(d0d1bcd)", "9e70905c0ffee1234567890abcdef1234567890a"]
    passed = ["1,048,576 bytes", "1048576", "decade", "cu130", "bf16", "version:2.6.0", "2026-11-27",
              "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6  train.de.gz",
              "AVX512-BF16", "pytorch/pytorch#135712", "ids 0-3"]
    assert [s for s in flagged if not COMMIT.search(s)] == []
    assert [s for s in passed if COMMIT.search(s)] == []
    assert all(ISSUE.search(s) for s in ("issue 37", "the issue's aim of Issue #37", "issues 25"))
    assert not ISSUE.search("no issue is open; 37 runs")


def test_results_is_one_page_of_tables():
    lines = (DOCS / "results.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"docs/results.md has {len(lines)} lines; the history belongs in docs/lab/"


def test_no_user_page_names_a_commit_or_an_issue():
    found = []
    for path in user_pages():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {m.group()}" for m in COMMIT.finditer(line)]
            found += [f"{path.relative_to(ROOT)}:{number}: {m.group()}" for m in ISSUE.finditer(line)]
    assert found == [], "say what was measured, on which machine and date; the history goes in docs/lab/"


def test_the_readmes_first_screen_reaches_a_translation():
    first_screen = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:40])
    assert "scripts/translate.py" in first_screen
    assert "uv run python scripts/train.py --config cpu_15min.yaml" in first_screen


def test_the_readme_links_the_notebook():
    targets = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert NOTEBOOK in targets
    assert (ROOT / NOTEBOOK).is_file()


@pytest.mark.parametrize("path", sorted((LAB / "retired-configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_retired_config_still_loads_as_the_history_says(path):
    cfg = load_config(str(path))
    assert cfg.name == path.stem  # so its run directory is runs/<name>, as the history's commands expect


# A model file's name with the suffix runs wrote before model files: best.pt, avg.pt, epoch_07.pt, epoch_NN.pt.
PT_MODEL_FILE = re.compile(r"\b(?:best|avg|epoch_(?:\d+|NN|\*))\.pt\b")


def test_no_page_names_a_pt_model_file_except_as_an_older_runs():
    """Runs write best.safetensors (avg, epoch_NN too); a .pt name is only for the files of older versions, in a
    sentence that says so (last.pt, which resuming reads, stays a .pt file)."""
    files = [*sorted((ROOT / "configs").glob("*.yaml")), *sorted((ROOT / "examples").rglob("*.*")),
             ROOT / NOTEBOOK, ROOT / "README.md", *user_pages()]
    found = []
    for path in files:
        text = " ".join(path.read_text(encoding="utf-8").split())
        for sentence in re.split(r"(?<=[.;:])\s", text):
            if PT_MODEL_FILE.search(sentence) and not re.search(r"\b(older|earlier)\b", sentence):
                found.append(f"{path.relative_to(ROOT)}: {PT_MODEL_FILE.search(sentence).group()} in {sentence!r}")
    assert found == [], "name the model file (best.safetensors), or say the .pt file is an older version's"
