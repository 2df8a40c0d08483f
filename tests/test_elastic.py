"""torchrun's elastic restarts: restarted ranks join a fresh process group; a rank that cannot join says why.

Under torchrun every rank is a client of one store the elastic agent keeps, on the same port, across
restarts; `init_distributed` puts each restart's keys under their own prefix so that the restarted
ranks never read a killed worker's gloo address (pytorch/pytorch#135712).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from annotated_transformer.runtime.errors import DistributedError, UserError, run_cli
from annotated_transformer.harness.distributed import DistInfo, _restart_scoped_store, init_distributed

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT")


def torchrun_free_env(with_package: bool = False) -> dict[str, str]:
    """This process's environment without torchrun's variables, one thread a rank (and the checkout importable)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if with_package:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    for name in TORCHRUN_VARS + ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE",):
        env.pop(name, None)
    return env


@pytest.fixture
def torchrun_env(monkeypatch):
    """A function that replaces torchrun's environment variables with the given ones."""

    def set_env(**values):
        for name in TORCHRUN_VARS:
            monkeypatch.delenv(name, raising=False)
        for name, value in values.items():
            monkeypatch.setenv(name, str(value))

    return set_env


@pytest.fixture
def agent_store():
    """A TCPStore server standing in for the one torchrun's agent hosts at MASTER_ADDR:MASTER_PORT."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def agent_env(store, restart: int, **extra) -> dict:
    return dict(RANK=0, LOCAL_RANK=0, WORLD_SIZE=2, GROUP_WORLD_SIZE=1, MASTER_ADDR="127.0.0.1",
                MASTER_PORT=store.port, TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT=restart,
                **extra)


def test_init_failure_is_one_line_user_error(torchrun_env, monkeypatch, capsys):
    torchrun_env(RANK=1, LOCAL_RANK=1, WORLD_SIZE=2, MASTER_ADDR="10.1.2.3", MASTER_PORT=29500)

    def refuse(**kwargs):
        raise RuntimeError("Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: SO_ERROR: "
                           "Connection refused, remote=[127.0.0.1]:50052$1\nframe #0: c10d::ProcessGroupGloo")

    monkeypatch.setattr(dist, "init_process_group", refuse)
    with pytest.raises(DistributedError) as err:
        init_distributed("cpu")
    message = str(err.value)
    assert isinstance(err.value, UserError)
    assert "\n" not in message and "frame #0" not in message
    for part in ("rank 1 of 2", "gloo process group", "10.1.2.3:29500",
                 "RuntimeError: Gloo connectFullMesh failed", "Connection refused",
                 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        assert part in message

    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: init_distributed("cpu"))
    assert exit_.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: rank 1 of 2 could not join the gloo process group at 10.1.2.3:29500")
    assert stderr.count("\n") == 1


def test_bad_agent_address_is_a_user_error_too(torchrun_env, agent_store):
    torchrun_env(**{**agent_env(agent_store, 0), "MASTER_PORT": "not-a-port"})
    with pytest.raises(DistributedError, match=r"rank 0 of 2 could not join .*:not-a-port \(ValueError"):
        init_distributed("cpu")


def test_a_restart_does_not_see_the_killed_workers_keys(torchrun_env, agent_store):
    torchrun_env(**agent_env(agent_store, 0))
    first = _restart_scoped_store(DistInfo(0, 0, 2), timedelta(seconds=10))
    first.set("0/1", "address of a worker that was killed")
    torchrun_env(**agent_env(agent_store, 1))
    second = _restart_scoped_store(DistInfo(0, 0, 2), timedelta(seconds=10))
    assert not second.check(["0/1"])
    second.set("0/1", "address of its replacement")
    assert first.get("0/1") == b"address of a worker that was killed"
    assert sorted(agent_store.list_keys()) == ["annotated_transformer/restart_0/0/1",
                                               "annotated_transformer/restart_1/0/1"]


@pytest.mark.parametrize("env", [{}, {"TORCHELASTIC_USE_AGENT_STORE": "False"},
                                 {"TORCHELASTIC_USE_AGENT_STORE": "True", "GROUP_WORLD_SIZE": 2}],
                         ids=["no-agent-store", "agent-store-off", "several-nodes"])
def test_torch_default_store_elsewhere(torchrun_env, env):
    torchrun_env(RANK=0, LOCAL_RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=1, **env)
    assert _restart_scoped_store(DistInfo(0, 0, 2), timedelta(seconds=1)) is None


def test_init_joins_with_the_restart_scoped_store(torchrun_env, agent_store, monkeypatch):
    torchrun_env(**agent_env(agent_store, 2))
    seen = {}
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: seen.update(kwargs))
    info, device = init_distributed("cpu")
    assert (info.rank, info.world_size, device.type) == (0, 2, "cpu")
    assert (seen["backend"], seen["rank"], seen["world_size"]) == ("gloo", 0, 2)
    assert isinstance(seen["store"], dist.PrefixStore)
    seen["store"].set("probe", "1")
    assert "annotated_transformer/restart_2/probe" in agent_store.list_keys()


# scripts/train.py under torchrun, with one change: rank 1 of the job's first attempt sends itself a signal after
# optimizer step AT ("kill AT": SIGKILL, a crash that saves nothing, once epoch 1's last.pt is on disk; "term AT":
# SIGTERM, as a scheduler stopping one worker would). The step is fixed, so nothing depends on timing.
SIGNALLING_TRAIN = textwrap.dedent("""
    import os, signal, sys, time
    from annotated_transformer.cli import main
    from annotated_transformer.harness.trainer import Trainer

    how, at = sys.argv[1], int(sys.argv[2])
    real_should_stop = Trainer._should_stop

    def should_stop(self):
        first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
        if how != "none" and self.info.rank == 1 and first_attempt and self.train_state.step == at:
            if how == "kill":
                while not self.run.last.is_file():  # rank 0 writes it; the folder is shared
                    time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGTERM)
        return real_should_stop(self)

    Trainer._should_stop = should_stop
    main(["train", *sys.argv[3:]])
""")
# a copy-task model small enough that a step takes milliseconds
SMALL = ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2", "train.progress=false", "train.device=cpu"]


def torchrun_train(tmp_path: Path, restarts: int, how: str, at: int, *overrides: str) -> subprocess.CompletedProcess:
    """torchrun --nproc_per_node=2 --max-restarts=RESTARTS of SIGNALLING_TRAIN; its output (stdout and stderr) in
    stdout."""
    script = tmp_path / "signalling_train.py"
    script.write_text(SIGNALLING_TRAIN)
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         f"--max-restarts={restarts}", str(script), how, str(at), "--config", "copy.yaml", *SMALL, *overrides],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env=torchrun_free_env(with_package=True), timeout=300)


@pytest.mark.slow
def test_a_training_job_survives_a_killed_rank_and_ends_as_an_uninterrupted_one(tmp_path):
    """torchrun, 2 ranks, rank 1 SIGKILLed inside epoch 2: both ranks restart (a fresh process group: no stale
    gloo address) and continue from last.pt; the final state equals an uninterrupted run's."""
    from annotated_transformer.checkpoints import load_checkpoint

    common = ["train.epochs=2", "data.copy_batches=8", "data.copy_batch_size=16", "model.dropout=0.1",
              "train.log_every=1"]
    full = torchrun_train(tmp_path, 1, "none", 0, *common, f"train.out_dir={tmp_path / 'full'}")
    assert full.returncode == 0, full.stdout[-3000:]
    assert "resumed" not in full.stdout

    part = tmp_path / "part"
    killed = torchrun_train(tmp_path, 1, "kill", 11, *common, f"train.out_dir={part}")  # epoch 2 is steps 9 to 16
    assert killed.returncode == 0, killed.stdout[-3000:]
    assert killed.stdout.count(f"resumed {part / 'last.pt'}: after epoch 1 at step 8") == 1  # rank 0's line, once
    assert "connectFullMesh" not in killed.stdout  # the restart's ranks met at fresh addresses
    a, b = load_checkpoint(tmp_path / "full" / "last.pt"), load_checkpoint(part / "last.pt")
    clocks = ("train_seconds", "wall_seconds", "target_seconds")  # durations, which no two runs share
    assert {k: v for k, v in a["train_state"].items() if k not in clocks} == {
        k: v for k, v in b["train_state"].items() if k not in clocks} and a["train_state"]["step"] == 16
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert set(b["rng"]) == {"0", "1"}  # both ranks' random states, the restarted rank 1's included


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_at_the_next_step(tmp_path):
    """SIGTERM to rank 1 alone, with log intervals longer than the run: all ranks stop together, in the epoch."""
    from annotated_transformer.checkpoints import load_checkpoint

    out = tmp_path / "run"
    done = torchrun_train(tmp_path, 0, "term", 3, "train.epochs=1", "data.copy_batches=2000", "train.log_every=100000",
                          f"train.out_dir={out}")
    assert "stopped by a signal on another rank in epoch 1" in done.stdout, done.stdout[-3000:]
    state = load_checkpoint(out / "last.pt")["train_state"]
    # inside the epoch, at most 1000 steps (the longest gap between the ranks' comparisons) after the signal
    assert state["epoch"] == 0 and 3 <= state["step"] <= 1003


DISAGREE = """
import sys
from pathlib import Path
from annotated_transformer.config import load_config
from annotated_transformer.runtime.errors import UserError
from annotated_transformer.harness import run_dir, trainer
from annotated_transformer.harness.distributed import init_distributed

info, _ = init_distributed("cpu")
if info.rank == 1:  # this node's copy of the folder has no last.pt
    run_dir.RunDir.start_mode = lambda self, cfg, data=None: ("start", None)
try:
    trainer.train_worker(load_config("copy", sys.argv[2:]))
    message = "trained"
except UserError as exc:
    message = str(exc)
# A file per rank and exit 0: torchrun would stop the other worker as soon as one exits non-zero.
Path(sys.argv[1], f"rank{info.rank}.txt").write_text(message)
"""


@pytest.mark.slow
def test_ranks_that_see_the_run_directory_differently_all_stop_with_one_line(tmp_path, capsys):
    """Rank 0 would resume from last.pt, rank 1 (no shared folder) would start afresh: both refuse, nothing changes."""
    from annotated_transformer.cli import run as run_command

    out = tmp_path / "run"
    overrides = ["train.epochs=2", "data.copy_batches=5", *SMALL, f"train.out_dir={out}"]
    with pytest.raises(SystemExit) as done:  # stopped by train.max_steps inside epoch 2, in this process
        run_command("train", ["--config", "copy.yaml", *overrides, "train.max_steps=8"], "train.py")
    assert done.value.code == 0, capsys.readouterr().err[-2000:]
    before = {p.name: p.read_bytes() for p in out.glob("*.pt")}
    script = tmp_path / "disagree.py"
    script.write_text(textwrap.dedent(DISAGREE))
    env = torchrun_free_env(with_package=True)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
         str(tmp_path), *overrides], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text().startswith(
            f"the ranks see {out} differently (rank 0 would resume at step 8, rank 1 would start afresh at step 0)")
    assert {p.name: p.read_bytes() for p in out.glob("*.pt")} == before


def test_ranks_compare_signal_flags_about_once_a_second(monkeypatch):
    """Rank 0 times the steps between comparisons and sets the next gap (about CHECK_SECONDS); a signal is seen
    at the next comparison, and at an epoch's end at once."""
    from annotated_transformer.harness import resume

    clock = [0.0]
    monkeypatch.setattr(resume.time, "perf_counter", lambda: clock[0])
    calls = []
    real_all_reduce = dist.all_reduce
    monkeypatch.setattr(resume.dist, "all_reduce", lambda t, **kw: calls.append(1) or real_all_reduce(t, **kw))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        stop = resume.StopSignal()
        stop.install()
        stop.restore()
        clock[0] = 0.01  # the first step took 10 ms: the next comparison comes 100 steps later
        assert stop.stop_now(True) is False and len(calls) == 1
        stop.signum = signal.SIGTERM
        for _ in range(99):
            clock[0] += 0.01
            assert stop.stop_now(True) is False
        assert len(calls) == 1
        clock[0] += 0.01
        assert stop.stop_now(True) is True and len(calls) == 2
        assert stop.stop_now(True, force=True) is True and len(calls) == 3  # an epoch's end compares at once
        assert resume.StopSignal().stop_now(False) is False  # one process reads its own flag, no collective
        assert len(calls) == 3
    finally:
        dist.destroy_process_group()
