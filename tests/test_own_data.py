"""Training on your own parallel text (data.dataset=files, examples/own_data.yaml), bad files as one line each,
and Multi30k in either direction with the de->en default unchanged."""

from __future__ import annotations

import gzip
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest

from annotated_transformer.config import load_config
from annotated_transformer.data import load_translation_data, open_corpus
from annotated_transformer.data.cache import MANIFEST, cache_folder, cache_settings
from annotated_transformer.data.multi30k import MULTI30K_FILES
from annotated_transformer.data.tokenizers import word_tokenize
from annotated_transformer.runtime.errors import ConfigError, DataError
from annotated_transformer.scoring import bleu_tokenizer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "own_data.yaml"
# examples/own_data.yaml made small enough to train a few steps in seconds on two cores.
SMALL = ["model.N=1", "model.d_model=32", "model.d_ff=64", "data.batch_tokens=256", "train.epochs=2",
         "train.warmup=2", "train.keep_last_epochs=0", "train.average_last=0", "train.device=cpu",
         "train.precision=fp32", "train.progress=false", "train.log_every=1", "decode.max_len_a=5"]

# A made-up pair: "xx" words and their "yy" words (disjoint alphabets), translated word by word.
XX = ["ka", "lo", "mi", "pa", "ta", "ne", "ko", "bi"]
YY = ["ZU", "RY", "SO", "VE", "WI", "HU", "JO", "GE"]
# French -> English sentences from a few parts, so spaCy's French and English tokenizers see real text.
FR_EN = ({"Le chat": "The cat", "Le chien": "The dog", "La femme": "The woman", "L'homme": "The man"},
         {"mange": "eats", "voit": "sees", "aime": "loves", "suit": "follows"},
         {"une pomme.": "an apple.", "un livre.": "a book.", "la maison.": "the house.", "le ballon.": "the ball."})


def made_up_pairs(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """`n` sentence pairs of the made-up xx -> yy language (3-6 words, one yy word per xx word)."""
    pairs = []
    for _ in range(n):
        words = [rng.randrange(len(XX)) for _ in range(rng.randint(3, 6))]
        pairs.append((" ".join(XX[w] for w in words), " ".join(YY[w] for w in words)))
    return pairs


def french_pairs(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """`n` French -> English sentence pairs."""
    pairs = []
    for _ in range(n):
        chosen = [rng.choice(list(part.items())) for part in FR_EN]
        pairs.append((" ".join(fr for fr, _ in chosen), " ".join(en for _, en in chosen)))
    return pairs


def write_split(prefix: Path, src: str, tgt: str, pairs: list[tuple[str, str]], gz: bool = False) -> None:
    """PREFIX.SRC and PREFIX.TGT (gzip-compressed with `gz`), one sentence a line."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for lang, side in ((src, 0), (tgt, 1)):
        data = "".join(pair[side] + "\n" for pair in pairs).encode("utf-8")
        path = prefix.with_name(f"{prefix.name}.{lang}")
        if gz:
            path.with_name(path.name + ".gz").write_bytes(gzip.compress(data))
        else:
            path.write_bytes(data)


def write_corpus(folder: Path, src: str = "xx", tgt: str = "yy", test: bool = False) -> Path:
    """Train (gzip-compressed), val and optionally test files of a small corpus in `folder`; returns `folder`."""
    rng = random.Random(0)
    make = made_up_pairs if src == "xx" else french_pairs
    write_split(folder / "train", src, tgt, make(160, rng), gz=True)
    write_split(folder / "val", src, tgt, make(12, rng))
    if test:
        write_split(folder / "test", src, tgt, make(10, rng))
    return folder


def own_config(folder: Path, cache: Path, *overrides: str):
    """examples/own_data.yaml on the made-up xx -> yy corpus in `folder` (absolute prefixes), small and in fp32."""
    return load_config(str(EXAMPLE), [f"data.train={folder / 'train'}", f"data.val={folder / 'val'}", "data.test=null",
                                      "data.src_lang=xx", "data.tgt_lang=yy", "data.spm_vocab_size=40",
                                      f"data.cache_dir={cache}", *SMALL, *overrides])


def records(run_dir: Path, kind: str) -> list[dict]:
    """The run's metrics.jsonl records of one kind ('epoch', 'final', ...)."""
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


# --------------------------------------------------------------------------- training end to end


@pytest.mark.slow
def test_the_example_trains_on_made_up_languages_resumes_and_translates(tmp_path, monkeypatch, command, no_charts):
    monkeypatch.chdir(tmp_path)  # the example's prefixes (my_corpus/train, ...) start from the current folder
    write_corpus(tmp_path / "my_corpus")
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    args = ["train", "--config", EXAMPLE, "data.src_lang=xx", "data.tgt_lang=yy", "data.test=null",
            "data.spm_vocab_size=40", f"data.cache_dir={cache}", f"train.out_dir={run_dir}", *SMALL]
    code, out, err = command(*args, "train.max_steps=3")
    assert code == 0, err
    out = out.decode()
    assert "your files xx->yy: train 160, val 12 pairs" in out and "tokenised your files (spm mode)" in out
    assert "(test not scored)" in out  # no data.test: the final scores are on val
    assert "tok:13a" in records(run_dir, "final")[-1]["bleu_signature"]  # detokenised sacreBLEU, as for Multi30k
    assert "bleu" in records(run_dir, "epoch")[-1]  # val BLEU at the end of training, as train.bleu_every asks
    [entry] = cache.iterdir()
    assert entry.name.startswith("files-")
    settings = json.loads((entry / MANIFEST).read_text())["settings"]
    assert sorted(settings["data"]) == ["train.xx", "train.yy", "val.xx", "val.yy"]
    pipeline = json.loads((run_dir / "vocab" / "text_pipeline.json").read_text())
    assert (pipeline["src_lang"], pipeline["tgt_lang"], pipeline["mode"]) == ("xx", "yy", "spm")

    code, out, err = command(*args, "train.max_steps=5")  # a longer budget continues the run from its cache
    assert code == 0, err
    assert "resumed" in out.decode() and "loaded from cache" in out.decode()
    assert [p.name for p in cache.iterdir()] == [entry.name]

    code, out, err = command("translate", "--checkpoint", run_dir, "--device", "cpu", stdin=b"ka lo mi\n\npa ta\n")
    assert code == 0, err
    assert len(out.decode().split("\n")) == 4  # a line out per line in, the empty one kept


@pytest.mark.slow
def test_french_to_english_in_word_mode_scores_the_test_split(tmp_path, command, no_charts):
    folder = write_corpus(tmp_path / "fr-en", "fr", "en", test=True)
    run_dir = tmp_path / "run"
    code, out, err = command("train", "--config", EXAMPLE, f"data.train={folder / 'train'}",
                             f"data.val={folder / 'val'}", f"data.test={folder / 'test'}", "data.tokenizer=word",
                             "data.min_freq=1", "model.tie_embeddings=false", f"data.cache_dir={tmp_path / 'cache'}",
                             f"train.out_dir={run_dir}", "train.max_steps=3", *SMALL)
    assert code == 0, err
    assert "your files fr->en: train 160, val 12, test 10 pairs" in out.decode()
    final = records(run_dir, "final")[-1]
    assert "test_bleu" in final and "tok:none" in final["bleu_signature"]  # spaCy's tokens, scored as they are
    vocab = json.loads((run_dir / "vocab" / "vocab.src.json").read_text())["itos"]
    assert "L'" in vocab and "chat" in vocab and "pomme" in vocab  # spaCy's French rules split "L'homme"
    code, out, err = command("translate", "--checkpoint", run_dir, "--device", "cpu", stdin=b"Le chat voit un livre.\n")
    assert code == 0 and len(out.decode().splitlines()) == 1, err


# --------------------------------------------------------------------------- bad data: one line, nothing written


def damage(folder: Path, case: str) -> None:
    """Make one kind of bad data in a corpus written by `write_corpus`."""
    if case == "counts":
        (folder / "val.yy").write_text("ZU RY\nSO\n")
        (folder / "val.xx").write_text("ka lo\nmi\npa\n")
    elif case == "utf8":
        (folder / "val.xx").write_bytes("ka lo\nmi pa\nta ne \xe9\n".encode("latin-1"))
    elif case == "empty":
        (folder / "val.yy").write_bytes(b"")
    elif case == "missing":
        (folder / "train.yy.gz").unlink()
    elif case == "both":
        (folder / "val.xx.gz").write_bytes(gzip.compress((folder / "val.xx").read_bytes()))
    elif case == "gzip":
        (folder / "train.xx.gz").write_bytes((folder / "train.xx.gz").read_bytes()[:40])


@pytest.mark.parametrize("case, message", [
    ("counts", r"val\.xx has 3 lines but \S*val\.yy has 2: line i of one must be the translation"),
    ("utf8", r"val\.xx is not UTF-8 text: line 3 has the byte 0xe9; convert the file"),
    ("empty", r"val\.yy is empty: give a file with sentences, one a line"),
    ("missing", r"data\.train=\S*train needs the file \S*train\.yy \(or train\.yy\.gz\), which does not exist"),
    ("both", r"data\.val=\S*val names both \S*val\.xx and \S*val\.xx\.gz; remove one"),
    ("gzip", r"train\.xx\.gz is not a complete gzip file"),
])
def test_bad_data_is_one_error_and_no_cache(tmp_path, case, message):
    folder = write_corpus(tmp_path / "corpus")
    damage(folder, case)
    with pytest.raises(DataError, match=message):
        load_translation_data(own_config(folder, tmp_path / "cache"), log=None)
    assert not (tmp_path / "cache").exists()  # no half cache, not even its folder


def test_bad_data_through_the_train_command_is_one_line_and_exit_2(tmp_path, command):
    folder = write_corpus(tmp_path / "corpus")
    damage(folder, "counts")
    code, out, err = command("train", "--config", EXAMPLE, f"data.train={folder / 'train'}",
                             f"data.val={folder / 'val'}", "data.test=null", "data.src_lang=xx", "data.tgt_lang=yy",
                             f"data.cache_dir={tmp_path / 'cache'}", f"train.out_dir={tmp_path / 'run'}", *SMALL)
    lines = err.decode().strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    assert f"{folder / 'val.xx'} has 3 lines but {folder / 'val.yy'} has 2" in lines[0]
    assert not (tmp_path / "cache").exists()


def test_a_cache_dir_that_is_a_file_is_one_line(tmp_path, command):
    corpus, not_a_folder = write_corpus(tmp_path / "corpus"), tmp_path / "notes.txt"
    not_a_folder.write_text("mine\n")
    code, _, err = command("prepare-data", "--config", str(EXAMPLE), f"data.train={corpus / 'train'}",
                           f"data.val={corpus / 'val'}", "data.test=null", "data.src_lang=xx", "data.tgt_lang=yy",
                           f"data.cache_dir={not_a_folder}")
    assert code == 2 and err.decode() == (f"error: data.cache_dir {not_a_folder} is a file, not a folder; set "
                                          "data.cache_dir to a folder (one that does not exist yet is made)\n")
    assert not_a_folder.read_text() == "mine\n"


@pytest.mark.parametrize("overrides, message", [
    (["data.val=null"], r"data\.dataset=files needs data\.val: the path prefix of the xx/yy files"),
    (["data.dataset=multi30k"], r"data\.train, data\.val name your own files, which data\.dataset=multi30k does not"),
    (["data.dataset=multi30k", "data.val=null"], r"data\.train names your own files, which data\.dataset=multi30k"),
    (["data.src_lang=x/y"], r"data\.src_lang 'x/y' is not a language code"),
])
def test_config_mistakes_about_the_files(tmp_path, overrides, message):
    write_corpus(tmp_path / "corpus")
    with pytest.raises(ConfigError, match=message):
        own_config(tmp_path / "corpus", tmp_path / "cache", *overrides)


def test_multi30k_is_german_and_english_only():
    with pytest.raises(ConfigError, match=r"Multi30k is German and English, not fr->en: .*data\.dataset=files"):
        load_config("tiny", ["data.src_lang=fr"])


def test_word_mode_without_a_spacy_language_says_to_use_spm(tmp_path):
    folder = write_corpus(tmp_path / "corpus")
    cfg = own_config(folder, tmp_path / "cache", "data.tokenizer=word", "model.tie_embeddings=false")
    with pytest.raises(ConfigError, match=r"no word tokenizer for 'yy' \(spaCy does not know the language\); set "
                                          r"data\.tokenizer=spm"):
        load_translation_data(cfg, log=None)
    assert not (tmp_path / "cache").exists()


def test_a_missing_test_split_is_named_when_asked_for(tmp_path):
    corpus = open_corpus(own_config(write_corpus(tmp_path / "corpus"), tmp_path / "cache").data)
    assert corpus.splits == ("train", "val")
    with pytest.raises(DataError, match=r"there is no test split: set data\.test"):
        corpus.read("test")


def test_the_cache_key_follows_the_files_content(tmp_path):
    folder = write_corpus(tmp_path / "corpus")
    cfg = own_config(folder, tmp_path / "cache")
    before = cache_folder(cfg.data, cache_settings(cfg.data, open_corpus(cfg.data).fingerprint()))
    (folder / "val.yy").write_text((folder / "val.yy").read_text().replace("ZU", "RY", 1))
    after = cache_folder(cfg.data, cache_settings(cfg.data, open_corpus(cfg.data).fingerprint()))
    assert before.name.startswith("files-") and after.name.startswith("files-") and before != after



def test_pairs_with_an_empty_side_are_counted_and_said(tmp_path):
    """Kept (a user's corpus is trained as given) but counted in the statistics and the summary line."""
    from annotated_transformer.data.translation_data import stats_summary

    rng = random.Random(0)
    pairs = made_up_pairs(160, rng)
    pairs[3], pairs[7] = ("", pairs[3][1]), (pairs[7][0], "")
    write_split(tmp_path / "corpus" / "train", "xx", "yy", pairs)
    write_split(tmp_path / "corpus" / "val", "xx", "yy", made_up_pairs(12, rng))
    data = load_translation_data(own_config(tmp_path / "corpus", tmp_path / "cache"), log=None)
    assert data.stats["empty"] == {"train": 2, "val": 0} and len(data.splits["train"]) == 160
    assert "pairs with one or both sides empty (kept): 2 train" in stats_summary(data.stats)


# --------------------------------------------------------------------------- the cache: rebuilt only when damaged


@pytest.fixture
def built(tmp_path):
    """(config, cache folder, the data) of a cache just built from the made-up corpus."""
    cfg = own_config(write_corpus(tmp_path / "corpus"), tmp_path / "cache")
    data = load_translation_data(cfg, log=None)
    return cfg, Path(data.stats["cache"]), data


def cut_in_half(path: Path) -> None:
    """A file cut short, as by a full disk or a killed copy."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def drop_checksums(folder: Path) -> None:
    """The cache as it was written before manifest.json held checksums."""
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    del manifest["checksums"]
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def short_offsets(folder: Path) -> None:
    """val's source files rewritten, whole .npy files, with a sentence fewer than the manifest counts."""
    offsets = np.load(folder / "val.src.offsets.npy")[:-1]
    ids = np.load(folder / "val.src.ids.npy")[: offsets[-1]]
    np.save(folder / "val.src.offsets.npy", offsets)
    np.save(folder / "val.src.ids.npy", ids)


@pytest.mark.parametrize("damage, file, reason", [
    (lambda f: cut_in_half(f / "train.src.ids.npy"), "train.src.ids.npy",
     "its sha256 is not the one manifest.json recorded"),
    (lambda f: (f / "text" / "text_pipeline.json").write_text("[]"), "text/text_pipeline.json", "its sha256 is not"),
    (lambda f: (f / "val.tgt.offsets.npy").unlink(), "val.tgt.offsets.npy", "missing"),
    (lambda f: (f / MANIFEST).write_text('{"settings": '), MANIFEST, "not valid JSON: "),
    # caches written before the checksums: what does not parse, or does not add up
    (lambda f: (drop_checksums(f), cut_in_half(f / "train.src.ids.npy")), "train.src.ids.npy",
     "cut short or padded: "),
    (lambda f: (drop_checksums(f), (f / "train.tgt.ids.npy").write_bytes(b"not an array")), "train.tgt.ids.npy",
     "ValueError: "),
    (lambda f: (drop_checksums(f), short_offsets(f)), "val.src.offsets.npy",
     "it holds 11 sentences, manifest.json says 12"),
    (lambda f: (drop_checksums(f), (f / "text" / "text_pipeline.json").write_text("[]")), "text/text_pipeline.json",
     "a JSON list, not an object of settings"),
])
def test_a_damaged_cache_is_rebuilt_with_one_line_naming_the_file(built, damage, file, reason):
    cfg, folder, data = built
    before = [a.tolist() for a in data.splits["train"].src]  # read now: `data` maps the files damaged next
    damage(folder)
    lines = []
    again = load_translation_data(cfg, log=lines.append)
    said = [line for line in lines if line.startswith("the data cache")]
    assert len(said) == 1 and said[0].startswith(f"the data cache {folder} is damaged ({file}: {reason}"), lines
    assert said[0].endswith("); rebuilding it") and again.stats["built"]
    assert [a.tolist() for a in again.splits["train"].src] == before
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # rebuilt in place, no temporary left
    assert not load_translation_data(cfg, log=None).stats["built"]  # and whole again


def test_a_cache_written_before_the_checksums_still_reads(built):
    cfg, folder, data = built
    drop_checksums(folder)
    lines = []
    again = load_translation_data(cfg, log=lines.append)
    assert not again.stats["built"] and not [line for line in lines if line.startswith(("the data cache", "tokenised"))]
    assert [a.tolist() for a in again.splits["val"].tgt] == [a.tolist() for a in data.splits["val"].tgt]


@pytest.mark.parametrize("error, message", [
    (PermissionError(13, "Permission denied", "train.src.ids.npy"),
     "cannot read the data cache {folder} (train.src.ids.npy: Permission denied); check its permissions and the "
     "disk, or set data.cache_dir to another folder"),
    (MemoryError(), "not enough memory to read the data cache {folder}; free some memory (other programs) and run "
                    "again, or set data.cache_dir to another folder"),
])
def test_a_cache_that_cannot_be_read_is_one_line_and_kept(built, monkeypatch, error, message):
    from annotated_transformer.data import cache

    cfg, folder, _ = built
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    def fail(path, *args, **kwargs):
        raise error

    monkeypatch.setattr(cache.np, "load", fail)
    with pytest.raises(DataError) as raised:
        load_translation_data(cfg, log=None)
    assert str(raised.value) == message.format(folder=folder)
    assert {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_a_killed_builds_temporary_is_removed_at_the_next_build_and_a_live_ones_kept(tmp_path, monkeypatch):
    from annotated_transformer.data import cache

    cache_dir = tmp_path / "cache"
    host, gone = cache._host(), 2**22 + 1  # above any pid Linux gives (pid_max is at most 2**22)
    key = "0123456789abcdef"
    names = {
        "killed": f".files-{key}.{host}.{gone}.k1ll3d_0.tmp",
        "live": f".files-{key}.{host}.{os.getpid()}.l1ve0000.tmp",  # this process's: never removed
        "just_now": f".files-{key}.{host}.{gone}.n0w00000.tmp",  # touched a moment ago: maybe another container's
        "elsewhere": f".files-{key}.otherhost.{gone}.abcdefgh.tmp",  # another machine's, on a shared cache_dir
        "not_ours": f".files-{key}.tmp",  # not this project's naming
    }
    long_ago = time.time() - 2 * cache.DEAD_AFTER_S
    for label, name in names.items():
        (cache_dir / name).mkdir(parents=True)
        (cache_dir / name / "train.src.ids.npy").write_bytes(b"half")
        if label != "just_now":
            os.utime(cache_dir / name, (long_ago, long_ago))
    renamed = []
    rename = os.rename
    monkeypatch.setattr(cache.os, "rename", lambda src, dst: renamed.append(Path(src).name) or rename(src, dst))
    load_translation_data(own_config(write_corpus(tmp_path / "corpus"), cache_dir), log=None)
    left = {p.name for p in cache_dir.iterdir() if p.name.startswith(".")}
    assert left == {name for label, name in names.items() if label != "killed"}
    [written] = renamed  # the build's own temporary carries this host and this process
    match = cache.TEMPORARY.match(written)
    assert match and match["host"] == host and match["pid"] == str(os.getpid()), written


def test_bleu_tokenises_as_sacrebleu_does_for_the_target_language():
    assert [bleu_tokenizer("spm", lang) for lang in ("en", "de", "fr", "xx", "zh")] == ["13a"] * 4 + ["zh"]
    assert bleu_tokenizer("word", "zh") == "none"  # word mode scores spaCy's tokens as they are
    # a region, a script or capitals, as OPUS names files (train.zh_CN): Chinese all the same (they got 13a)
    assert [bleu_tokenizer("spm", lang) for lang in ("zh-CN", "zh_TW", "ZH", "zh-Hant", "en-US")] == ["zh"] * 4 + [
        "13a"]


# --------------------------------------------------------------------------- Multi30k both ways


def raw_lines(folder: Path, name: str) -> list[str]:
    with gzip.open(folder / name, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f.read().split("\n")[:-1]]


def test_multi30k_en_de_reads_english_as_the_source(multi30k_dir):
    cfg = load_config("cpu_15min_en_de", [f"data.root={multi30k_dir}"])
    assert (cfg.data.src_lang, cfg.data.tgt_lang) == ("en", "de")
    src, tgt = open_corpus(cfg.data).read("train")
    assert src[0] == raw_lines(multi30k_dir, "train.en.gz")[0] and tgt[0] == raw_lines(multi30k_dir, "train.de.gz")[0]
    assert src[0].startswith("Two young, White males")
    settings = cache_settings(cfg.data)
    assert (settings["src_lang"], settings["tgt_lang"]) == ("en", "de")
    assert cache_folder(cfg.data) != cache_folder(load_config("cpu_15min", [f"data.root={multi30k_dir}"]).data)


@pytest.mark.slow
def test_multi30k_en_de_ids_are_de_en_ids_swapped(multi30k_data, tiny_config):
    swapped = load_translation_data(tiny_config("data.src_lang=en", "data.tgt_lang=de"), log=None)
    assert swapped.text.src_vocab == multi30k_data.text.tgt_vocab  # word mode: a vocabulary per language
    assert swapped.text.tgt_vocab == multi30k_data.text.src_vocab
    for name, split in swapped.splits.items():
        before = multi30k_data.splits[name]
        assert split.src_text == before.tgt_text and split.tgt_text == before.src_text
        assert all((a == b).all() for a, b in zip(split.src, before.tgt))
        assert all((a == b).all() for a, b in zip(split.tgt, before.src))


def test_multi30k_de_en_keeps_its_cache_key_and_tokens(multi30k_data, multi30k_dir, tiny_config):
    d = tiny_config().data
    # The settings the de->en cache was keyed by before own files existed, at cache format 2 (flat id files).
    assert {k: v for k, v in cache_settings(d).items() if k != "spacy"} == {
        "format": 2, "data": dict(sorted(MULTI30K_FILES.items())), "src_lang": "de", "tgt_lang": "en",
        "tokenizer": "word", "lowercase": False, "min_freq": 2, "references": "tokenised"}
    folder = Path(multi30k_data.stats["cache"])
    assert folder == cache_folder(d) and folder.name.startswith("multi30k-")
    text = multi30k_data.text
    for name, stem in (("train", "train"), ("val", "val"), ("test", "test_2016_flickr")):
        split = multi30k_data.splits[name]
        de, en = raw_lines(multi30k_dir, f"{stem}.de.gz"), raw_lines(multi30k_dir, f"{stem}.en.gz")
        assert split.src_text == de and split.tgt_text == en
        for i in range(0, len(split), len(split) // 20):
            assert split.src[i].tolist() == text.numericalize(word_tokenize(de[i], "de"), "src")
            assert split.tgt[i].tolist() == text.numericalize(word_tokenize(en[i], "en"), "tgt")


@pytest.mark.parametrize("device, cuda_here, static", [
    ("auto", False, False), ("auto", True, True), ("cuda", False, True), ("cpu", True, False)])
def test_prepare_data_counts_the_batches_of_the_plan_training_takes(tmp_path, command, monkeypatch, device, cuda_here,
                                                                   static):
    # data.static_shapes=auto: the static-shape plan where training takes a CUDA GPU, the bucket plan elsewhere
    monkeypatch.setattr("torch.cuda.is_available", lambda: cuda_here)
    corpus = write_corpus(tmp_path / "corpus")
    code, out, err = command("prepare-data", "--config", str(EXAMPLE), f"data.train={corpus / 'train'}",
                             f"data.val={corpus / 'val'}", "data.test=null", "data.src_lang=xx", "data.tgt_lang=yy",
                             f"data.cache_dir={tmp_path / 'cache'}", *SMALL, "data.spm_vocab_size=40",
                             "data.static_shapes=auto", f"train.device={device}", "--json")
    assert code == 0, err.decode()
    stats = json.loads(out)
    assert ("static_shapes" in stats) == static  # the count of the static plan's batch shapes, when it counts them
    if not static:
        assert stats["batches_per_epoch"] == stats["batches_per_epoch_bucket"]


def test_a_prefix_given_as_a_folder_or_with_its_language_says_what_a_prefix_is(tmp_path):
    from annotated_transformer.data.own_files import find_file
    from annotated_transformer.runtime.errors import DataError

    (tmp_path / "corpus").mkdir()
    with pytest.raises(DataError, match=r"data.train is the files' prefix, not their folder: e.g. "
                                        rf"data.train={tmp_path / 'corpus' / 'train'} for .*train\.de$"):
        find_file(f"{tmp_path / 'corpus'}/", "de", "data.train")
    with pytest.raises(DataError, match=rf"the prefix leaves out the language code: data.val={tmp_path / 'val'}$"):
        find_file(str(tmp_path / "val.de"), "de", "data.val")
