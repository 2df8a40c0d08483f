"""A run directory belongs to one live training (an OS lock on <run>/.lock), and a full disk is one clear line."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from annotated_transformer.config import load_config
from annotated_transformer.runtime.errors import ConfigError, RunDirError
from annotated_transformer import checkpoints
from annotated_transformer.harness import trainer as trainer_module
from annotated_transformer.checkpoints import CheckpointWriter, load_checkpoint, write_failure
from annotated_transformer.harness.run_dir import LOCK_FILE, MARKER, RunDir
from annotated_transformer.harness.trainer import train_worker

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no flock on Windows: the folder is not locked there")

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["train.progress=false", "train.device=cpu"]


# Locks a folder, says so, and holds it until its stdin closes; with "fork", first forks a child that lives
# on (as a DataLoader worker would) and says so after its at-fork handlers ran. Each line is one os.write,
# so the two processes' lines never interleave on the shared pipe.
HOLDER = textwrap.dedent("""
    import os, sys
    from annotated_transformer.harness.run_dir import RunDir
    run = RunDir(sys.argv[1])
    run.lock()
    if sys.argv[2:] == ["fork"] and os.fork() == 0:
        os.write(1, f"child {os.getpid()}\\n".encode())
        sys.stdin.read()
        os._exit(0)
    os.write(1, f"locked {os.getpid()}\\n".encode())
    sys.stdin.read()
    run.unlock()
""")

# Tries to lock a folder as a script does: a UserError is one `error:` line and exit 2.
def in_use(folder: Path, pid: int) -> str:
    """The refusal a folder held by process `pid` on this host gets."""
    return (f"run directory {folder} is in use by another training (pid {pid} on this host); wait for it to end or "
            f"stop it (kill {pid}), or choose another train.out_dir")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative name -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@contextmanager
def held(folder: Path, *extra: str) -> Iterator[tuple[subprocess.Popen, list[str]]]:
    """Another process holding `folder`'s lock; yields it and the lines it printed once it holds the lock."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), *extra], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        lines = [proc.stdout.readline() for _ in range(1 + len(extra))]  # blocks until the lock is held
        assert any(line.startswith("locked") for line in lines), lines
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=60)


# --------------------------------------------------------------------------- the lock, in one process


def test_a_held_folder_is_refused_with_its_holder_named(tmp_path):
    first, second = RunDir(tmp_path / "run"), RunDir(tmp_path / "run")
    first.lock()  # a second open file of .lock conflicts even within one process
    assert json.loads(first.lock_file.read_text()) == {"pid": os.getpid(), "host": socket.gethostname()}
    with pytest.raises(RunDirError) as refused:
        second.lock()
    assert str(refused.value) == in_use(tmp_path / "run", os.getpid())
    assert not first.has_run() and first.start_mode(load_config("copy", [f"train.out_dir={first.path}"]))[0] == "start"
    first.unlock()
    assert not (tmp_path / "run").exists()  # lock() made the folder, nothing was written: nothing is left
    second.lock()
    second.unlock()


def test_an_unreadable_holder_file_still_refuses(tmp_path):
    first = RunDir(tmp_path)
    first.lock()
    first.lock_file.write_text("garbage")  # the pid is informative only: the flock decides
    with pytest.raises(RunDirError, match=r"in use by another training \(its process id is unknown\); wait"):
        RunDir(tmp_path).lock()
    first.unlock()
    assert sorted(os.listdir(tmp_path)) == []  # .lock removed, the folder (made by pytest) kept


def test_starting_afresh_keeps_the_lock_file(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "config.yaml").write_text("x")
    (tmp_path / "vocab").mkdir()
    (tmp_path / MARKER).write_text("{}")  # a run of this version that died in its first epoch
    run.lock()
    inode = run.lock_file.stat().st_ino
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.overwrite=true"])
    run.prepare(cfg, "start")  # empties the folder for a fresh start ...
    assert run.lock_file.stat().st_ino == inode  # ... but the locked file stays, so nobody can lock a new one
    with pytest.raises(RunDirError, match="in use by another training"):
        RunDir(tmp_path).lock()
    run.unlock()


def test_a_filesystem_without_locks_runs_unguarded_and_says_so(tmp_path, monkeypatch):
    """flock refused by the filesystem (ENOLCK on some network mounts): the run goes on, with one warning line."""
    from annotated_transformer.harness import run_dir as run_dir_module
    from annotated_transformer.harness.distributed import DistInfo

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(run_dir_module.fcntl, "flock", no_locks)
    run, lines = RunDir(tmp_path / "run"), []
    cfg = load_config("copy", [f"train.out_dir={tmp_path / 'run'}", *QUIET])
    assert run.open(cfg, DistInfo(), log=lines.append)[0] == "start"
    assert len(lines) == 1 and lines[0].startswith(f"warning: cannot lock {run.lock_file} (No locks available")
    assert "start one at a time" in lines[0]
    assert run.marker.is_file()  # the run's folder was made all the same
    run.unlock()


class FakeTrainer:
    """Stands in for the Trainer: checks that the folder is held while it "trains"."""

    fail: BaseException | None = None

    def __init__(self, cfg, info, device, run, start_mode, last, corpus) -> None:
        self.path = cfg.run_dir()

    def fit(self) -> dict:
        with pytest.raises(RunDirError, match="in use by another training"):
            RunDir(self.path).lock()
        if self.fail is not None:
            raise self.fail
        return {"fitted": True}


@pytest.mark.parametrize("fail", [None, RuntimeError("boom"), KeyboardInterrupt()])
def test_train_worker_holds_the_folder_while_it_runs_and_releases_it_after(tmp_path, monkeypatch, fail):
    monkeypatch.setattr(trainer_module, "Trainer", type("Failing", (FakeTrainer,), {"fail": fail}))
    cfg = load_config("copy", [f"train.out_dir={tmp_path / 'run'}", *QUIET])
    if fail is None:
        assert train_worker(cfg) == {"fitted": True}
    else:
        with pytest.raises(type(fail)):
            train_worker(cfg)
    run = RunDir(tmp_path / "run")
    run.lock()  # free at once
    run.unlock()


def test_a_refused_start_releases_the_folder_and_leaves_no_folder(tmp_path):
    cfg = load_config("copy", [f"train.out_dir={tmp_path / 'run'}", "train.resume=true", *QUIET])
    with pytest.raises(ConfigError, match="train.resume=true but"):
        train_worker(cfg)
    assert not (tmp_path / "run").exists()
    deep = tmp_path / "runs" / "2026" / "run"  # nor the folders above it that the lock made (runs/2026/ stayed)
    cfg = load_config("copy", [f"train.out_dir={deep}", "train.resume=true", *QUIET])
    with pytest.raises(ConfigError, match="train.resume=true but"):
        train_worker(cfg)
    assert sorted(os.listdir(tmp_path)) == []
    mine = tmp_path / "mine"  # an empty folder of yours above it stays: only what the lock made goes
    mine.mkdir()
    cfg = load_config("copy", [f"train.out_dir={mine / 'a' / 'run'}", "train.resume=true", *QUIET])
    with pytest.raises(ConfigError, match="train.resume=true but"):
        train_worker(cfg)
    assert sorted(os.listdir(tmp_path)) == ["mine"] and os.listdir(mine) == []


def test_a_live_runs_folder_is_refused_even_with_overwrite(tmp_path, monkeypatch):
    """Refused at once, before the overwrite's data is built (a corpus may take minutes to tokenise), untouched."""
    monkeypatch.setattr(trainer_module, "Trainer", FakeTrainer)
    built = []
    monkeypatch.setattr(trainer_module.TaskFiles, "build", lambda self, *a, **k: built.append(self))
    (tmp_path / "last.pt").write_bytes(b"a live run's checkpoint")
    (tmp_path / MARKER).write_text("{}")
    holder = RunDir(tmp_path)
    holder.lock()
    before = snapshot(tmp_path)
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.overwrite=true", *QUIET])
    with pytest.raises(RunDirError, match=f"run directory {tmp_path} is in use"):
        train_worker(cfg)
    assert snapshot(tmp_path) == before and built == []
    holder.unlock()


def _open_a_held_folder(rank: int, folder: str, out: str) -> None:
    """One of two gloo ranks opening a folder that another process holds; writes the line it ended with."""
    from datetime import timedelta

    import torch.distributed as dist

    from annotated_transformer.harness.distributed import DistInfo
    from annotated_transformer.runtime.errors import UserError

    dist.init_process_group("gloo", init_method=f"file://{out}.init", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        cfg = load_config("copy", [f"train.out_dir={folder}", "train.overwrite=true", *QUIET])
        try:  # `ready` meets the other rank, as the data build of an overwrite does under torchrun
            RunDir(folder).open(cfg, DistInfo(rank, rank, 2), ready=dist.barrier)
            line = "opened"
        except UserError as exc:
            line = f"{type(exc).__name__}: {exc}"
        Path(f"{out}.{rank}").write_text(line)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes, each importing torch
def test_under_torchrun_a_held_folder_stops_every_rank_in_one_line(tmp_path):
    """Rank 0 cannot lock; rank 1 must not go on to build the data alone (the ranks met in different collectives:
    a hang until the timeout)."""
    import torch.multiprocessing as mp

    folder, out = tmp_path / "run", tmp_path / "said"
    holder = RunDir(folder)
    holder.lock()
    try:
        mp.spawn(_open_a_held_folder, args=(str(folder), str(out)), nprocs=2)
    finally:
        holder.unlock()
    refused = in_use(folder, os.getpid())
    assert Path(f"{out}.0").read_text() == f"RunDirError: {refused}"
    assert Path(f"{out}.1").read_text() == f"DistributedError: rank 0 could not use {folder}: {refused}"


# --------------------------------------------------------------------------- the lock, across processes


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a child")
def test_a_killed_holder_leaves_no_stale_lock_even_with_a_forked_child_alive(tmp_path):
    folder = tmp_path / "run"
    with held(folder, "fork") as (holder, lines):
        child = int(next(line for line in lines if line.startswith("child")).split()[1])
        try:
            os.kill(holder.pid, signal.SIGKILL)
            assert holder.wait(timeout=60) == -signal.SIGKILL
            assert (folder / LOCK_FILE).is_file()  # the file a killed run leaves ...
            run = RunDir(folder)
            run.lock()  # ... is no lock: free at once, though the holder's forked child still runs
            run.unlock()
        finally:
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_the_train_command_refuses_a_held_folder_and_writes_nothing(tmp_path, train_command):
    folder = tmp_path / "run"
    with held(folder) as (holder, _):
        (folder / "config.yaml").write_text("a live run's config\n")
        before = snapshot(folder)
        for extra in ([], ["train.overwrite=true"]):
            code, _, err = train_command("--config", "copy.yaml", f"train.out_dir={folder}", *QUIET, *extra)
            assert code == 2, err
            assert err == f"error: {in_use(folder, holder.pid)}\n"
            assert holder.poll() is None and snapshot(folder) == before  # the holder runs on, its files untouched
    assert holder.returncode == 0


TORCHRUN_WORKER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from annotated_transformer.config import load_config
    from annotated_transformer.runtime.errors import UserError
    from annotated_transformer.harness import trainer
    from annotated_transformer.harness.distributed import init_distributed

    info, _ = init_distributed("cpu")
    try:
        trainer.train_worker(load_config("copy", sys.argv[2:]))
        message = "trained"
    except UserError as exc:
        message = f"{type(exc).__name__}: {exc}"
    # A file per rank and exit 0: torchrun would stop the other worker as soon as one exits non-zero.
    Path(sys.argv[1], f"rank{info.rank}.txt").write_text(message)
""")


@pytest.mark.slow
def test_under_torchrun_every_rank_stops_when_rank_0_is_refused(tmp_path):
    folder = tmp_path / "run"
    script = tmp_path / "worker.py"
    script.write_text(TORCHRUN_WORKER)
    torchrun_vars = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                     "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    env = {k: v for k, v in os.environ.items() if k not in torchrun_vars}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    with held(folder) as (holder, _):
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
             str(tmp_path), f"train.out_dir={folder}", *QUIET], capture_output=True, text=True, cwd=tmp_path,
            env=env, timeout=300)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        refusal = in_use(folder, holder.pid)
        assert (tmp_path / "rank0.txt").read_text() == f"RunDirError: {refusal}"
        assert (tmp_path / "rank1.txt").read_text() == f"DistributedError: rank 0 could not use {folder}: {refusal}"
        assert sorted(os.listdir(folder)) == [LOCK_FILE]


# --------------------------------------------------------------------------- a full disk


def full_disk_message(folder: Path, name: str, code: int = errno.ENOSPC) -> str:
    """The line a full disk (or quota) gives while writing `name` in a run folder that holds a last.pt."""
    free = "free some disk space" if code == errno.ENOSPC else "free some quota"
    return (f"cannot write {folder / name}: {os.strerror(code)}; {free} on the disk holding {folder}, then run the "
            f"same command again to resume from {folder / 'last.pt'}, which is intact")


class FullFile(io.RawIOBase):
    """A file on a disk with `room` bytes left: a write beyond them fails with ENOSPC, as the kernel says it.

    With a few hundred bytes of room torch.save fails as a RuntimeError (its zip writer checks the file
    position), with none as the OSError itself: both happen on a full disk.
    """

    def __init__(self, room: int = 1000) -> None:
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return len(data)


def test_torch_save_on_a_full_disk_is_a_runtime_error_that_becomes_enospc(tmp_path):
    with pytest.raises(RuntimeError, match="unexpected pos") as raised:  # torch's: no errno, the OSError in its context
        torch.save({"w": torch.zeros(1000)}, FullFile())
    failure = write_failure(raised.value, tmp_path / "last.pt")
    assert isinstance(failure, OSError) and failure.errno == errno.ENOSPC
    assert write_failure(RuntimeError("CUDA error: out of memory"), tmp_path / "last.pt") is None


def test_a_write_failure_without_its_cause_is_told_by_the_free_space(tmp_path, monkeypatch):
    stream = RuntimeError("[enforce fail at inline_container.cc:475] . PytorchStreamWriter failed writing file "
                          "data/0: file write failed")
    failure = write_failure(stream, tmp_path / "last.pt")
    assert failure.errno == errno.EIO and "PytorchStreamWriter failed writing file" in failure.strerror
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda path: type("U", (), {"free": 4096})())
    assert write_failure(stream, tmp_path / "last.pt").errno == errno.ENOSPC


@pytest.mark.parametrize("how", ["oserror", "quota", "torch"])
def test_the_writer_thread_reports_a_full_disk_as_one_line_and_keeps_last_pt(tmp_path, monkeypatch, how):
    writer = CheckpointWriter(tmp_path)
    last = tmp_path / "last.pt"
    writer.save(({"model": {"w": torch.ones(100)}, "config": {}}, [last]))
    writer.wait()
    before = hashlib.sha256(last.read_bytes()).hexdigest()
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")  # the temporary file gets some bytes before the disk fills up
        if how in ("oserror", "quota"):
            code = errno.ENOSPC if how == "oserror" else errno.EDQUOT
            raise OSError(code, os.strerror(code))
        return real_save(obj, FullFile(), *args, **kwargs)  # torch's own RuntimeError

    monkeypatch.setattr(torch, "save", full_disk)
    writer.save(({"model": {"w": torch.zeros(100)}, "config": {}}, [last]))
    with pytest.raises(RunDirError) as raised:
        writer.wait()
    assert str(raised.value) == full_disk_message(tmp_path, "last.pt", errno.EDQUOT if how == "quota" else errno.ENOSPC)
    monkeypatch.setattr(torch, "save", real_save)
    assert hashlib.sha256(last.read_bytes()).hexdigest() == before
    assert torch.equal(load_checkpoint(last)["model"]["w"], torch.ones(100))
    assert sorted(os.listdir(tmp_path)) == ["last.pt"]  # the half-written temporary file is gone


def test_a_full_disk_under_metrics_or_config_is_one_line(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    cfg = load_config("copy", [f"train.out_dir={tmp_path}"])
    run.prepare(cfg, "start")
    run.save_settings(cfg, None)
    config = run.config.read_bytes()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)  # atomic_write's fsync of config.yaml and metrics.jsonl
    with pytest.raises(RunDirError) as raised:
        run.save_settings(cfg, None)
    assert str(raised.value) == (f"cannot write {run.config}: No space left on device; free some disk space on the "
                                 f"disk holding {tmp_path}, then run the same command again to start the run again")
    assert run.config.read_bytes() == config
    monkeypatch.setattr(Path, "open", no_space)
    with pytest.raises(RunDirError, match=r"cannot write .*metrics\.jsonl: No space left on device; free some"):
        run.log_metrics({"kind": "epoch"})


@pytest.mark.slow  # over a second on 2 cores: the fast tier stays under a minute
def test_a_full_disk_during_training_is_one_line_exit_2_and_the_same_command_resumes(tmp_path, monkeypatch,
                                                                                    train_command):
    out = tmp_path / "run"
    args = ["--config", "copy.yaml", f"train.out_dir={out}", "train.epochs=2", "data.copy_batches=3", *QUIET]
    real_save, calls = torch.save, []

    def save(obj, f, *rest, **kwargs):  # epoch 1's last.pt fits; epoch 2's meets a full disk (the model files of
        calls.append(1)                 # each epoch are safetensors, written without torch.save)
        return real_save(obj, FullFile() if len(calls) == 2 else f, *rest, **kwargs)  # torch's own RuntimeError

    with monkeypatch.context() as m:
        m.setattr(torch, "save", save)
        code, _, err = train_command(*args)
    assert code == 2, err[-3000:]
    assert err == f"error: {full_disk_message(out, 'last.pt')}; it holds step 3\n"  # one line, no traceback
    assert len(calls) == 2
    assert load_checkpoint(out / "last.pt")["train_state"]["epoch"] == 1  # the previous last.pt
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp") or p.name == LOCK_FILE]
    code, stdout, err = train_command(*args)
    assert code == 0, err[-3000:]
    assert f"resumed {out / 'last.pt'}: after epoch 1 at step 3" in stdout
    assert load_checkpoint(out / "last.pt")["train_state"]["epoch"] == 2
    assert not (out / LOCK_FILE).exists()  # released at the normal end
