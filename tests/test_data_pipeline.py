"""The Multi30k pipeline on the real data: counts, vocabulary, epochs, batch bounds, padding, resume, ranks."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from annotated_transformer.config import load_config
from annotated_transformer.data import (
    BOS,
    EOS,
    PAD,
    UNK,
    TextPipeline,
    TranslationData,
    load_translation_data,
)
from annotated_transformer.data.notebook_pipeline import notebook_collate, notebook_raw_batches
from annotated_transformer.data.cache import CacheUnreadable, cache_folder, read_cache
from annotated_transformer.data.tokenizers import word_tokenize
from annotated_transformer.runtime.errors import DataError

# Word mode, min_freq 2, vocabulary from the 29,000 training pairs only (the notebook's
# train+val+test vocabulary had 8,315 / 6,384 entries).
VOCAB_SRC, VOCAB_TGT = 8012, 6190


def with_data(data: TranslationData, **changes) -> TranslationData:
    """The same data with other batching settings (no reloading)."""
    return dataclasses.replace(data, config=dataclasses.replace(data.config, **changes))


def rows(t: torch.Tensor) -> list[tuple[int, ...]]:
    """The rows of a padded (B, L) id tensor, padding removed."""
    return [tuple(x for x in r if x != PAD) for r in t.tolist()]


def batch_pairs(batch) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    tgt_full = torch.cat([batch.tgt[:, :1], batch.tgt_y], dim=1)  # (B, T+1): <s> ... </s>
    return list(zip(rows(batch.src), rows(tgt_full)))


def split_pairs(split) -> Counter:
    return Counter((tuple(s.tolist()), tuple(t.tolist())) for s, t in zip(split.src, split.tgt))


def epoch_batches(loader, epoch: int) -> list:
    loader.set_epoch(epoch)
    return list(loader)


# --------------------------------------------------------------------------- the data


def test_split_sizes_and_alignment(multi30k_data):
    data = multi30k_data
    assert {n: len(s) for n, s in data.splits.items()} == {"train": 29000, "val": 1014, "test": 1000}
    assert data.stats["splits"] == {"train": 29000, "val": 1014, "test": 1000}
    for split in data.splits.values():
        assert len(split.src_text) == len(split.tgt_text) == len(split.src) == len(split.tgt)
        for i in (0, 1, len(split) // 2, len(split) - 1):  # ids and raw text line up
            assert split.src[i][0] == BOS and split.src[i][-1] == EOS and split.src[i].dtype == np.int64
            words = word_tokenize(split.src_text[i], "de")
            expected = " ".join(t if t in data.text.src_vocab else "<unk>" for t in words)
            assert data.text.ids_to_text(split.src[i], "src") == expected
    assert data.splits["test"].tgt_text[0] == "A man in an orange hat starring at something."


def test_vocabulary_sizes_and_built_from_train_only(multi30k_data):
    text = multi30k_data.text
    assert (len(text.src_vocab), len(text.tgt_vocab)) == (VOCAB_SRC, VOCAB_TGT)
    assert multi30k_data.stats["vocab"] == {"src": VOCAB_SRC, "tgt": VOCAB_TGT}
    assert text.src_vocab.itos[:4] == ["<s>", "</s>", "<blank>", "<unk>"]
    for side, vocab in (("src", text.src_vocab), ("tgt", text.tgt_vocab)):
        train = multi30k_data.splits["train"]
        counts = np.bincount(np.concatenate(getattr(train, side)), minlength=len(vocab))
        # every word entry occurs at least min_freq=2 times in *train*: nothing came from val or test
        assert counts[4:].min() >= 2
        # and frequency order: counts never increase along the vocabulary
        assert np.all(np.diff(counts[4:]) <= 0)
    # val has words that train never saw twice: they are <unk>, not vocabulary entries
    val_ids = np.concatenate(multi30k_data.splits["val"].src)
    assert (val_ids == UNK).sum() > 0


def test_vocab_round_trips_through_run_dir_and_checkpoint(multi30k_data, tmp_path, weights_only_roundtrip):
    text = multi30k_data.text
    text.save(tmp_path / "vocab")
    assert TextPipeline.load(tmp_path / "vocab") == text
    assert TextPipeline.from_state_dict(weights_only_roundtrip(text.state_dict())) == text
    ids = multi30k_data.splits["val"].tgt[5]
    assert text.src_vocab.lookup_indices(text.src_vocab.lookup_tokens(multi30k_data.splits["val"].src[5])) \
        == multi30k_data.splits["val"].src[5].tolist()
    assert text.tgt_vocab.lookup_indices(text.ids_to_tokens(ids)) == ids[1:-1].tolist()


# --------------------------------------------------------------------------- training batches


@pytest.fixture(scope="module")
def bucket_4096(multi30k_data):
    """The training loader at the default 4096-token budget, and its first two epochs."""
    loader = with_data(multi30k_data, batch_tokens=4096).train_loader(seed=7)
    return loader, [epoch_batches(loader, 0), epoch_batches(loader, 1)]


def test_every_training_sentence_exactly_once_per_epoch(multi30k_data, bucket_4096):
    loader, epochs = bucket_4096
    expected = split_pairs(multi30k_data.splits["train"])
    for batches in epochs:
        assert len(batches) == len(loader)
        assert Counter(p for b in batches for p in batch_pairs(b)) == expected
    assert [len(b) for b in epochs[0]] != [len(b) for b in epochs[1]]  # reshuffled between epochs


def test_epoch_order_is_a_pure_function_of_seed_and_epoch(multi30k_data, bucket_4096):
    _, epochs = bucket_4096
    fresh = with_data(multi30k_data, batch_tokens=4096).train_loader(seed=7)
    replay = epoch_batches(fresh, 1)
    assert all(torch.equal(a.src, b.src) and torch.equal(a.tgt_y, b.tgt_y) for a, b in zip(replay, epochs[1]))
    other_seed = epoch_batches(with_data(multi30k_data, batch_tokens=4096).train_loader(seed=8), 1)
    assert [len(b) for b in other_seed] != [len(b) for b in epochs[1]]


@pytest.mark.parametrize("budget", [4096, 512])
def test_token_bound_of_every_batch(multi30k_data, bucket_4096, budget):
    if budget == 4096:
        batches = bucket_4096[1][0]
    else:
        batches = epoch_batches(with_data(multi30k_data, batch_tokens=budget).train_loader(seed=1), 0)
    for b in batches:
        padded = len(b) * max(b.src.size(1), b.tgt.size(1) + 1)  # max(S, T+1) * B
        assert padded <= budget or len(b) == 1
    # the budget is used well: batches are not tiny
    assert np.mean([len(b) * max(b.src.size(1), b.tgt.size(1) + 1) for b in batches]) > 0.8 * budget


def test_padding_fraction_under_10_percent(multi30k_data, bucket_4096):
    batches = bucket_4096[1][0]
    real = sum(int((b.src != PAD).sum()) + int((b.tgt_y != PAD).sum()) + len(b) for b in batches)
    positions = sum(b.src.numel() + b.tgt_y.numel() + len(b) for b in batches)
    fraction = 1 - real / positions
    assert fraction < 0.10
    assert multi30k_data.stats["padding_fraction_bucket"] < 0.10  # tiny config: 512-token batches
    assert multi30k_data.stats["padding_fraction_notebook"] > 0.7  # the notebook's fixed 72-token padding


def test_batches_carry_masks(bucket_4096):
    b = bucket_4096[1][0][0]
    B, S = b.src.shape
    T = b.tgt.size(1)
    assert b.src.dtype == torch.int64
    assert b.src_mask.shape == (B, 1, S) and b.tgt_mask.shape == (B, T, T)
    assert torch.equal(b.src_mask[:, 0], b.src != PAD)
    assert b.ntokens == int((b.tgt_y != PAD).sum()) > 0
    assert not b.tgt_mask[0, 0, 1]  # no peeking at the future


# --------------------------------------------------------------------------- resume


# one worker process: over a second on 2 cores, in the slow tier (the fast tier stays under a minute)
@pytest.mark.parametrize("num_workers", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_mid_epoch_resume_continues_with_the_next_batch(multi30k_data, num_workers, mid_epoch_resume):
    data = with_data(multi30k_data, batch_tokens=4096, num_workers=num_workers)
    state, second, full = mid_epoch_resume(lambda: data.train_loader(seed=11), epoch=2, taken=17)
    assert state["epoch"] == 2
    # the next epoch after the resumed one starts normally
    assert len(epoch_batches(second, 3)) == len(full)


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(0, 1), (1, 0), (1, 2)])
def test_a_resume_may_change_the_loader_workers(multi30k_data, before, after, mid_epoch_resume, weights_only_roundtrip):
    """data.num_workers may change at a resume (the loader's own state differs with worker processes): the epoch
    goes on with its next batch all the same, and so does a second resume inside it."""
    workers = iter([before, before, after])  # the uninterrupted loader, the stopped one, the resumed one
    make = lambda n: with_data(multi30k_data, batch_tokens=4096, num_workers=n).train_loader(seed=11)  # noqa: E731
    state, second, full = mid_epoch_resume(lambda: make(next(workers)), epoch=2, taken=17)
    assert second.taken == len(full)
    assert len(epoch_batches(second, 3)) == len(full)  # the next epoch from its first batch
    again = make(after)  # stopped again 10 batches after the resume, resumed with the same workers
    again.load_state_dict(state)
    it = iter(again)
    served = [next(it) for _ in range(10)]
    third = make(after)
    third.set_epoch(0)
    third.load_state_dict(weights_only_roundtrip(again.state_dict()))
    rest = list(third)
    assert third.taken == len(full) and len(served) + len(rest) == len(full) - 17
    for a, b in zip(served + rest, full[17:]):
        assert torch.equal(a.src, b.src) and torch.equal(a.tgt, b.tgt)


def test_resume_at_epoch_end_and_mismatched_world_size(multi30k_data, weights_only_roundtrip):
    loader = multi30k_data.train_loader(seed=3)
    loader.set_epoch(0)
    n = sum(1 for _ in loader)
    done = weights_only_roundtrip(loader.state_dict())
    resumed = multi30k_data.train_loader(seed=3)
    resumed.load_state_dict(done)
    assert list(resumed) == [] and n == len(loader)
    other = multi30k_data.train_loader(seed=3, rank=0, world_size=2)
    with pytest.raises(DataError, match="same number of processes"):
        other.load_state_dict(done)
    with pytest.raises(DataError, match="same seed"):
        multi30k_data.train_loader(seed=4).load_state_dict(done)


# --------------------------------------------------------------------------- ranks


def test_sharding_gives_every_rank_the_same_number_of_batches(multi30k_data):
    data = with_data(multi30k_data, batch_tokens=4096)
    world = 3
    loaders = [data.train_loader(seed=5, rank=r, world_size=world) for r in range(world)]
    per_rank = [epoch_batches(loader, 4) for loader in loaders]
    single = epoch_batches(data.train_loader(seed=5), 4)  # the same epoch's batches, unsharded
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) == len(loaders[0]) == -(-len(single) // world)
    seen = Counter(p for batches in per_rank for b in batches for p in batch_pairs(b))
    expected = split_pairs(data.splits["train"])
    assert set(seen) == set(expected)  # every sentence on some rank
    # only the wrap-around batches repeat: the first ones of the epoch, filling the last round of the ranks
    wrapped = single[: world * len(per_rank[0]) - len(single)]
    assert 0 < len(wrapped) < world
    assert sum(seen.values()) - sum(expected.values()) == sum(len(b) for b in wrapped)


def test_eval_batches_cover_each_sentence_once_across_ranks(multi30k_data):
    data = with_data(multi30k_data, batch_tokens=1024)
    expected = split_pairs(data.splits["val"])
    one = data.eval_batches("val")
    assert Counter(p for b in one for p in batch_pairs(b)) == expected
    assert all(len(b) * max(b.src.size(1), b.tgt.size(1) + 1) <= 1024 for b in one)
    assert all(torch.equal(a.src, b.src) for a, b in zip(one, data.eval_batches("val")))  # deterministic
    shards = [data.eval_batches("val", rank=r, world_size=2) for r in range(2)]
    merged = Counter(p for batches in shards for b in batches for p in batch_pairs(b))
    assert merged == expected
    assert abs(sum(map(len, shards[0])) - sum(map(len, shards[1]))) <= 1


# --------------------------------------------------------------------------- the notebook's batching


@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_notebook_mode_reproduces_the_notebook_batches(multi30k_data):
    data = with_data(multi30k_data, batching="notebook")
    loader = data.train_loader(seed=2)
    batches = epoch_batches(loader, 0)
    assert len(batches) == len(loader) == -(-29000 // 32)
    assert [len(b) for b in batches[:-1]] == [32] * (len(batches) - 1) and len(batches[-1]) == 29000 % 32
    assert all(b.src.size(1) == 72 and b.tgt.size(1) == 71 for b in batches)  # tgt + tgt_y: 72 ids
    assert Counter(p for b in batches for p in batch_pairs(b)) == split_pairs(data.splits["train"])
    # The notebook's way: raw pairs in the same order, tokenised with spaCy inside collate.
    raw = notebook_raw_batches(data.splits["train"].pairs(), seed=2, epoch=0)
    for batch, pairs in zip(batches[:3], raw):
        again = notebook_collate(pairs, data.text)
        assert torch.equal(again.src, batch.src) and torch.equal(again.tgt, batch.tgt)


# --------------------------------------------------------------------------- long sentences, caching


@pytest.mark.parametrize("policy", ["truncate", "skip"])
def test_long_sentences_are_truncated_or_skipped_and_counted(tiny_config, policy):
    data = load_translation_data(tiny_config("data.max_sentence_len=16", f"data.long_policy={policy}"), log=None)
    assert data.stats["cache_hit"]  # max_len and long_policy do not need a new tokenisation
    train, val = data.splits["train"], data.splits["val"]
    assert len(val) == 1014 and data.stats["truncated"]["val"] > 0  # val/test are never skipped
    for split in data.splits.values():
        assert max(split.src_lens.max(), split.tgt_lens.max()) <= 16
        assert all(s[-1] == EOS for s in split.src)
    if policy == "truncate":
        assert len(train) == 29000 and data.stats["truncated"]["train"] > 1000
        assert data.stats["skipped"]["train"] == 0
    else:
        skipped = data.stats["skipped"]["train"]
        assert skipped > 1000 and len(train) == 29000 - skipped == len(train.src_text)
        i = len(train) // 3  # text still aligned with ids after skipping
        assert train.src[i].tolist() == data.text.text_to_ids(train.src_text[i], "src")
        assert len(word_tokenize(train.src_text[i], "de")) + 2 <= 16
    assert data.stats["long_policy"] == policy


def test_cache_key_and_damaged_cache(multi30k_data, tiny_config, tmp_path):
    base = cache_folder(tiny_config().data)
    assert Path(multi30k_data.stats["cache"]) == base
    for same in ("data.max_sentence_len=20", "data.long_policy=skip", "data.batch_tokens=99", "data.batching=notebook"):
        assert cache_folder(tiny_config(same).data) == base
    for different in ("data.lowercase=true", "data.min_freq=3", "data.tokenizer=spm", "data.src_lang=en",
                      "data.spm_vocab_size=4000"):
        overrides = [different, "data.tgt_lang=de"] if "src_lang" in different else [different]
        if "spm_vocab_size" in different:
            overrides.append("data.tokenizer=spm")
            assert cache_folder(tiny_config(*overrides).data) != cache_folder(tiny_config("data.tokenizer=spm").data)
        assert cache_folder(tiny_config(*overrides).data) != base
    copy = tmp_path / base.name
    shutil.copytree(base, copy)
    text, splits, _ = read_cache(copy)  # the copy reads back as the cache it was made from
    assert (text.src_vocab, text.tgt_vocab) == (multi30k_data.text.src_vocab, multi30k_data.text.tgt_vocab)
    assert len(splits["train"]["src"]) == 29000
    assert [splits["val"]["src"][i].tolist() for i in range(5)] == [multi30k_data.splits["val"].src[i].tolist()
                                                                      for i in range(5)]
    data = (copy / "train.src.ids.npy").read_bytes()
    (copy / "train.src.ids.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(CacheUnreadable):
        read_cache(copy)


# --------------------------------------------------------------------------- subwords


@pytest.mark.slow
def test_spm_mode_on_multi30k(tiny_config):
    data = load_translation_data(tiny_config("data.tokenizer=spm", "data.spm_vocab_size=8000"), log=None)
    text = data.text
    assert text.shared_vocab and len(text.src_vocab) == len(text.tgt_vocab) == 8000
    assert text.src_vocab.itos[:4] == ["<s>", "</s>", "<blank>", "<unk>"]
    val = data.splits["val"]
    for i in range(0, len(val), 50):  # exact detokenisation, as detokenised BLEU needs
        assert text.ids_to_text(val.tgt[i]) == " ".join(val.tgt_text[i].split())
    again = load_translation_data(tiny_config("data.tokenizer=spm", "data.spm_vocab_size=8000"), log=None)
    assert again.stats["cache_hit"] and again.text == text


# --------------------------------------------------------------------------- torch.distributed


def _ddp_worker(rank: int, world: int, init_file: str, root: str, bad_root: str, cache_dir: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        result: dict = {}
        try:  # rank 0 fails: every rank must get the error instead of waiting forever
            load_translation_data(load_config("tiny", [f"data.root={bad_root}", f"data.cache_dir={cache_dir}"]),
                                  rank, world, log=None)
        except DataError as exc:
            result["error"] = str(exc)
        data = load_translation_data(load_config("tiny", [f"data.root={root}", f"data.cache_dir={cache_dir}"]),
                                     rank, world, log=None)
        loader = data.train_loader(seed=1, rank=rank, world_size=world)
        loader.set_epoch(0)
        result.update(built=data.stats["built"], len=len(loader), n=sum(1 for _ in loader),
                      vocab=len(data.text.src_vocab), first=data.splits["train"].src[0].tolist())
        Path(out, f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_distributed_rank0_builds_others_wait(multi30k_dir, tmp_path):
    import torch.multiprocessing as mp

    bad = tmp_path / "bad"
    bad.mkdir()
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(multi30k_dir), str(bad), str(tmp_path / "cache"),
                                str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2))
    assert "is missing" in r0["error"] and "rank 0 could not prepare the data" in r1["error"]
    assert r0["built"] is True and r1["built"] is False  # only rank 0 tokenised
    assert r0["len"] == r1["len"] == r0["n"] == r1["n"]  # equal batch counts: no hang at epoch end
    assert r0["vocab"] == r1["vocab"] == VOCAB_SRC and r0["first"] == r1["first"]
