"""RaggedIds, many sentences in one flat (memory-mapped) array: what it serves, how it travels to a DataLoader
worker, and the training batches read from it, the same as from a list of arrays."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

from annotated_transformer.data.ids import MappedArray, RaggedIds, lengths_of
from annotated_transformer.data.loader import PairDataset, TrainLoader
from annotated_transformer.data.text import truncate_ids
from annotated_transformer.data.vocab import BOS, EOS


def sentences(n: int, seed: int = 0) -> list[np.ndarray]:
    """`n` id arrays <s> ... </s> of random lengths (3 to 70 ids) and random ids."""
    g = np.random.default_rng(seed)
    return [np.array([BOS, *g.integers(4, 900, k - 2), EOS], dtype=np.int64) for k in g.integers(3, 71, n)]


def mapped(rows: list[np.ndarray], folder, name: str) -> RaggedIds:
    """`rows` written as a flat id file and an offsets file, read back memory-mapped (as the data cache is)."""
    packed = RaggedIds.from_rows(rows)
    np.save(folder / f"{name}.ids.npy", packed.flat)
    np.save(folder / f"{name}.offsets.npy", packed.offsets)
    return RaggedIds(np.load(folder / f"{name}.ids.npy", mmap_mode="r"),
                     np.load(folder / f"{name}.offsets.npy", mmap_mode="r"))


def equal_rows(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b))


# --------------------------------------------------------------------------- RaggedIds


def test_packed_rows_serve_the_rows_cut_and_chosen(tmp_path):
    rows = sentences(50)
    for ids in (RaggedIds.from_rows(rows), mapped(rows, tmp_path, "src")):
        assert equal_rows(ids, rows) and np.array_equal(ids.lengths, lengths_of(rows))
        cut = ids.limited(10)
        assert equal_rows(cut, [truncate_ids(r, 10) for r in rows]) and cut.lengths.max() == 10
        keep = np.array([7, 3, 49])
        assert equal_rows(cut.subset(keep), [truncate_ids(rows[i], 10) for i in keep])
        assert equal_rows(ids[10:20], rows[10:20]) and equal_rows(cut[::-7], [truncate_ids(r, 10) for r in rows[::-7]])
        assert isinstance(ids[:3], RaggedIds) and len(ids[60:]) == 0
        assert np.array_equal(ids[-1], rows[-1])
        with pytest.raises(IndexError):
            ids[50]
        with pytest.raises(TypeError, match="index or a slice"):
            ids[[1, 2]]
    chunked = RaggedIds.from_chunks(iter([rows[:20], [], rows[20:]]), limit=10)
    assert equal_rows(chunked, [truncate_ids(r, 10) for r in rows]) and chunked.flat.dtype == np.int32
    assert len(RaggedIds.from_chunks([])) == 0


def test_a_pickled_memory_map_travels_as_its_files_names(tmp_path):
    rows = sentences(400)
    ids = mapped(rows, tmp_path, "src")
    size = ids.flat.nbytes + ids.offsets.nbytes
    for dumps in (pickle.dumps, lambda x: bytes(ForkingPickler.dumps(x))):  # the latter: what spawn sends a worker
        data = dumps(PairDataset(ids.limited(12).subset(np.arange(0, 400, 3)), ids))
        assert len(data) < size / 10 and b"src.ids.npy" in data
        back = pickle.loads(data)
        mapped_file = back.tgt.flat.base
        assert isinstance(mapped_file, np.memmap) and str(mapped_file.filename) == str(ids.flat.base.filename)
        assert equal_rows(back.tgt, rows) and equal_rows(back.src, [truncate_ids(r, 12) for r in rows[::3]])
    # a view part way into a mapped file keeps its place; an array in memory goes by value
    whole = np.load(tmp_path / "src.ids.npy", mmap_mode="r")
    tail = RaggedIds(whole[5:], ids.offsets[3:] - 5)
    again = pickle.loads(pickle.dumps(tail))
    assert isinstance(again.flat.base, np.memmap) and equal_rows(again, rows[3:])
    memory = RaggedIds.from_rows(rows)
    assert equal_rows(pickle.loads(pickle.dumps(memory)), rows)
    assert not any(isinstance(x, MappedArray) for x in memory.__reduce__()[1])


# --------------------------------------------------------------------------- the training batches


def batches(loader: TrainLoader, epoch: int) -> list:
    loader.set_epoch(epoch)
    return list(loader)


def same_batches(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.src, y.src) and torch.equal(x.tgt, y.tgt) and torch.equal(x.tgt_y, y.tgt_y) for x, y in zip(a, b))


@pytest.mark.parametrize("mode", ["bucket", "static", "notebook"])
def test_the_loader_serves_the_same_batches_from_ragged_ids_as_from_lists(mode, tmp_path):
    src, tgt = sentences(300, seed=1), sentences(300, seed=2)
    keep = np.flatnonzero(np.random.default_rng(3).random(300) < 0.8)  # long_policy=skip's kept rows, and a limit
    as_lists = [truncate_ids(src[i], 40) for i in keep], [truncate_ids(tgt[i], 40) for i in keep]
    ragged = (mapped(src, tmp_path, "src").limited(40).subset(keep),
              RaggedIds.from_rows(tgt).limited(40).subset(keep))
    settings = dict(batching="notebook" if mode == "notebook" else "bucket", batch_tokens=1500,
                    static_shapes=mode == "static")
    for seed in (0, 7):
        for rank in range(2):
            lists = TrainLoader(*as_lists, seed=seed, rank=rank, world_size=2, **settings)
            packed = TrainLoader(*ragged, seed=seed, rank=rank, world_size=2, **settings)
            assert np.array_equal(packed.src_lens, lists.src_lens) and len(packed) == len(lists)
            for epoch in (0, 1):
                assert same_batches(batches(packed, epoch), batches(lists, epoch))
                assert packed.global_tokens(epoch) == lists.global_tokens(epoch)


def test_a_loader_on_ragged_ids_resumes_mid_epoch(tmp_path, mid_epoch_resume):
    src, tgt = mapped(sentences(200, seed=4), tmp_path, "src"), mapped(sentences(200, seed=5), tmp_path, "tgt")
    _, _, full = mid_epoch_resume(lambda: TrainLoader(src, tgt, batch_tokens=1000, seed=3), epoch=1, taken=3)
    lists = TrainLoader(list(src), list(tgt), batch_tokens=1000, seed=3)
    assert same_batches(full, batches(lists, 1))


@pytest.mark.slow  # worker processes: seconds on 2 cores
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_worker_process_reads_the_mapped_ids(tmp_path, start):
    src, tgt = mapped(sentences(300, seed=6), tmp_path, "src"), mapped(sentences(300, seed=7), tmp_path, "tgt")
    in_process = batches(TrainLoader(src, tgt, batch_tokens=800, seed=2), 1)
    worker = TrainLoader(src, tgt, batch_tokens=800, seed=2, num_workers=1)
    # fork shares the maps with the worker; spawn (macOS's default, forkserver's way too) pickles the dataset,
    # which then carries the files' names (the test above) and the worker maps them itself
    worker.loader.multiprocessing_context = start
    assert same_batches(batches(worker, 1), in_process)
