"""A synthetic parallel corpus of WMT length, made from Multi30k's lines (make-synthetic-corpus, benchmark --scale).

Each line is two random Multi30k pairs joined, the German with the German and the English with the
English: Multi30k's captions have about 12 words, two of them about 24, the length of a WMT14
English-German sentence. The training lines come from Multi30k's training pairs, val's from its val
pairs and test's from its test2016 pairs, so no val or test sentence is a training sentence. With 29,000
pairs to draw from, a million lines are nearly all distinct (841 million ordered pairs of pairs).

    folder/train.de  folder/train.en    --pairs lines
    folder/val.de    folder/val.en      --val-pairs lines
    folder/test.de   folder/test.en     --test-pairs lines
    folder/corpus.json                  what was made (the manifest), written last

The same seed makes the same bytes. The lines are drawn and written CHUNK at a time, so memory holds
Multi30k and one chunk, never the corpus. Each file is written under a temporary name and renamed
when whole, and the manifest comes last: a folder with a manifest holds a whole corpus, which is how
the scale benchmark knows it may reuse one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..runtime.errors import UserError
from ..runtime.files import atomic_write, refuse_to_replace, write_json, writing

LANGS = ("de", "en")
SPLITS = ("train", "val", "test")  # each split's lines come from the Multi30k split of the same name
MANIFEST = "corpus.json"
FORMAT = 1  # in the manifest: a corpus made by another version of this module is not reused
CHUNK = 65_536  # lines drawn and written at once


@dataclass(frozen=True)
class CorpusSpec:
    """What a synthetic corpus is: its sizes and its seed (the manifest holds these and the format)."""

    pairs: int  # training pairs (WMT14 English-German: about 4.5 million)
    val_pairs: int = 3000  # newstest2013 has 3,000
    test_pairs: int = 3000  # newstest2014 has 3,003
    seed: int = 1

    def sizes(self) -> dict[str, int]:
        """Lines of each split."""
        return {"train": self.pairs, "val": self.val_pairs, "test": self.test_pairs}

    def manifest(self) -> dict[str, Any]:
        """The manifest's content."""
        return {"format": FORMAT, **asdict(self), "made_from": "Multi30k (train, val, test2016)"}

    def check(self) -> None:
        """Every size at least 1; a UserError naming the option otherwise."""
        for option, value in (("--pairs", self.pairs), ("--val-pairs", self.val_pairs),
                              ("--test-pairs", self.test_pairs)):
            if value < 1:
                raise UserError(f"{option} must be at least 1, got {value}")


def corpus_files(folder: Path) -> list[Path]:
    """Every file a corpus in `folder` has, the manifest last."""
    return [folder / f"{split}.{lang}" for split in SPLITS for lang in LANGS] + [folder / MANIFEST]


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of the corpus in `folder`, or None where there is none (or it is unreadable)."""
    try:
        value = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def has_corpus(folder: Path, spec: CorpusSpec, option: str = "--data-dir") -> bool:
    """Whether `folder` holds the whole corpus `spec` (True) or none of its files (False); a UserError when it holds
    another corpus, or files of a corpus's names that no manifest vouches for (nothing there is replaced)."""
    manifest = read_manifest(folder)
    if manifest == spec.manifest() and all(p.is_file() for p in corpus_files(folder)):
        return True
    if manifest is not None:
        made = {key: manifest.get(key) for key in ("pairs", "val_pairs", "test_pairs", "seed")}
        raise UserError(f"{option} {folder} holds another synthetic corpus ({made}), not {asdict(spec)}: give "
                        f"another {option}, or remove that folder")
    found = [p.name for p in corpus_files(folder) if p.exists()]
    if found:
        raise UserError(f"{option} {folder} holds {found[0]} but no {MANIFEST}: not a whole synthetic corpus (a "
                        f"make that was stopped, or your own files); give another {option}, or remove that folder")
    return False


def joined_chunks(src: Sequence[str], tgt: Sequence[str], lines: int, rng: np.random.Generator
                  ) -> Iterator[tuple[str, str]]:
    """`lines` lines of two random pairs of (src, tgt) joined, as (source text, target text) blocks of up to
    CHUNK lines each (every line ends with a newline)."""
    n, chunk = len(src), CHUNK
    for start in range(0, lines, chunk):
        picks = rng.integers(0, n, size=(min(chunk, lines - start), 2)).tolist()  # (lines, 2): two pairs a line
        yield ("".join(f"{src[a]} {src[b]}\n" for a, b in picks),
               "".join(f"{tgt[a]} {tgt[b]}\n" for a, b in picks))


def write_split(folder: Path, split: str, pairs: tuple[Sequence[str], Sequence[str]], lines: int, seed: int
                ) -> None:
    """folder/SPLIT.de and folder/SPLIT.en: `lines` joined lines of `pairs` (German, English), each written under a
    temporary name and renamed when whole. The split's own random stream ([seed, its index]) makes it independent
    of the other splits' sizes."""
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    de_path, en_path = (folder / f"{split}.{lang}" for lang in LANGS)

    def write_both(de: Any) -> None:  # each file under a temporary of its own, renamed when whole
        def write_en(en: Any) -> None:
            for de_text, en_text in joined_chunks(*pairs, lines, rng):
                de.write(de_text.encode("utf-8"))
                en.write(en_text.encode("utf-8"))
        atomic_write(en_path, write_en)

    with writing(folder, f"write the {split} split into"):  # a full disk (gigabytes at the paper's scale): one line
        atomic_write(de_path, write_both)


def check_folder(folder: Path, overwrite: bool, option: str = "--out") -> None:
    """The output rule for a corpus folder (given as `option`), before any work: a folder (or none yet), and no
    corpus file there unless `overwrite`."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{option} {folder} is a file; give the folder to write the corpus into")
    # a run's marker (harness.run_dir.MARKER: named, not imported, as making a corpus loads no torch), an export's
    if any((folder / name).exists() for name in (".annotated-transformer-run", "last.pt", "model.bin")):
        raise UserError(f"{option} {folder} is a training run's (or an export's) folder; give the corpus a folder of "
                        "its own")
    for path in corpus_files(folder):
        refuse_to_replace(path, overwrite, option)


def write_corpus(folder: str | Path, spec: CorpusSpec, multi30k: Callable[[str], tuple[list[str], list[str]]],
                 overwrite: bool = False, log: Callable[[str], None] | None = None, option: str = "--out"
                 ) -> dict[str, Any]:
    """Make the corpus `spec` in `folder` (given as `option`) from `multi30k(split)`'s (German, English) lines;
    returns the manifest.

    An existing corpus file there is refused (one line, before anything is written) unless `overwrite`; then only the
    corpus's own files are replaced, its manifest removed first so that a make stopped half-way is never taken for
    a whole corpus.
    """
    folder = Path(folder).expanduser()
    spec.check()
    check_folder(folder, overwrite, option)
    with writing(folder, "prepare the corpus folder"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MANIFEST).unlink(missing_ok=True)
    for split, lines in spec.sizes().items():
        if log:
            log(f"{split}: {lines:,} pairs, each two Multi30k {split} pairs joined -> {folder}/{split}.de, .en")
        write_split(folder, split, multi30k(split), lines, spec.seed)
    manifest = spec.manifest()
    write_json(folder / MANIFEST, manifest)
    return manifest


def multi30k_lines(root: Path) -> Callable[[str], tuple[list[str], list[str]]]:
    """A function: the (German, English) lines of a Multi30k split in the folder `root` holds."""
    from ..data.multi30k import read_split

    return lambda split: read_split(root, split, "de", "en")
