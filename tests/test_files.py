"""Files we write get the permissions a plain open()/mkdir() would give, not mkstemp's owner-only ones."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from annotated_transformer.runtime.files import give_default_permissions
from annotated_transformer.checkpoints import save_checkpoint


@pytest.fixture(params=[0o022, 0o002])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_checkpoints_follow_the_umask(tmp_path, umask):
    save_checkpoint({"x": 1}, tmp_path / "a.pt")
    assert mode(tmp_path / "a.pt") == 0o666 & ~umask


def test_a_temporary_tree_gets_default_permissions(tmp_path, umask):
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    (root / "sub").mkdir(mode=0o700)
    fd, name = tempfile.mkstemp(dir=root / "sub")
    os.close(fd)
    assert mode(root) == 0o700 and mode(Path(name)) == 0o600  # what mkdtemp/mkstemp give
    give_default_permissions(root)
    assert mode(root) == mode(root / "sub") == 0o777 & ~umask
    assert mode(Path(name)) == 0o666 & ~umask


@pytest.mark.parametrize("kept", [0o444, 0o640])
def test_a_replaced_file_keeps_its_permissions(tmp_path, umask, kept):
    """--overwrite of a file you made read-only (or private): the new content, its mode kept (it became 0644)."""
    from annotated_transformer.runtime.files import atomic_write

    path = tmp_path / "out.txt"
    path.write_text("old\n")
    path.chmod(kept)
    atomic_write(path, lambda f: f.write(b"new\n"))
    assert path.read_text() == "new\n" and mode(path) == kept
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"  # a link replaced by a file: not its target's mode
    target.write_text("target\n")
    target.chmod(0o4600 | kept)
    link.symlink_to(target)
    atomic_write(link, lambda f: f.write(b"new\n"))
    assert not link.is_symlink() and mode(link) == 0o666 & ~umask and target.read_text() == "target\n"


def test_a_json_result_that_cannot_be_written_is_one_line(tmp_path):
    """What a benchmark writes after minutes of measuring: a refused write is one RunDirError line, not a traceback."""
    from annotated_transformer.runtime.errors import RunDirError
    from annotated_transformer.runtime.files import write_json

    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(RunDirError, match=rf"^cannot write {blocker}: .*; .*choose another place to write$"):
        write_json(blocker / "r.json", {"tokens_per_s": 1.0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_an_output_that_is_a_symbolic_link_is_written_through(tmp_path):
    """--out LINK --overwrite: the file the link names gets the translations and the link stays (the link was
    replaced by a file, and the file it named kept its old text)."""
    from annotated_transformer.cli.options import check_out_file
    from annotated_transformer.cli.translate import write_output

    (tmp_path / "results").mkdir()
    target, link = tmp_path / "results" / "today.txt", tmp_path / "latest.txt"
    target.write_text("yesterday\n")
    link.symlink_to(Path("results") / "today.txt")
    check_out_file(link, overwrite=True, inputs={})
    write_output(str(link), lambda f: f.write("today\n"))
    assert link.is_symlink() and os.readlink(link) == str(Path("results") / "today.txt")
    assert target.read_text() == "today\n"
    assert sorted(os.listdir(tmp_path / "results")) == ["today.txt"] and sorted(os.listdir(tmp_path)) == [
        "latest.txt", "results"]


def test_a_link_among_the_projects_own_files_is_replaced_never_written_through(tmp_path):
    """A run folder copied as links (`cp -as runs/a runs/b`): training b replaces b's links with its own files and
    never writes into a's."""
    from annotated_transformer.runtime.files import atomic_write

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "config.yaml").write_text("run a\n")
    (tmp_path / "b" / "config.yaml").symlink_to(tmp_path / "a" / "config.yaml")
    atomic_write(tmp_path / "b" / "config.yaml", lambda f: f.write(b"run b\n"))
    assert not (tmp_path / "b" / "config.yaml").is_symlink()
    assert (tmp_path / "b" / "config.yaml").read_text() == "run b\n" and (tmp_path / "a" / "config.yaml").read_text() \
        == "run a\n"
    from annotated_transformer.scoring import write_hypotheses

    (tmp_path / "a" / "best.test.beam1.txt").write_text("run a's hypotheses\n")  # evaluate's default, a sweep's
    (tmp_path / "b" / "best.test.beam1.txt").symlink_to(tmp_path / "a" / "best.test.beam1.txt")
    write_hypotheses(tmp_path / "b" / "best.test.beam1.txt", ["run b's"])
    assert (tmp_path / "a" / "best.test.beam1.txt").read_text() == "run a's hypotheses\n"
    assert (tmp_path / "b" / "best.test.beam1.txt").read_text() == "run b's\n"
