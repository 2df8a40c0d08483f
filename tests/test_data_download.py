"""Getting Multi30k: real downloads from a throw-away HTTP server on 127.0.0.1, verification, clear errors."""

from __future__ import annotations

import functools
import gzip
import http.server
import re
import shutil
import socket
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from annotated_transformer.cli import run
from annotated_transformer.data.multi30k import MULTI30K_FILES, read_split, resolve_multi30k_dir, sha256_file
from annotated_transformer.runtime.errors import DataError


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def do_GET(self) -> None:
        self.server.requests[self.path.rsplit("/", 1)[-1]] += 1
        super().do_GET()


@pytest.fixture
def serve():
    """serve(folder) -> base URL of an HTTP server on 127.0.0.1 serving `folder` (its .requests counts GETs)."""
    servers = []

    def start(folder: Path):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(folder)))
        server.requests = Counter()
        # a short poll: shutdown() waits up to one poll interval (0.5 s by default) at every teardown
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/data/task1/raw", server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def copy_dataset(src: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in MULTI30K_FILES:
        shutil.copyfile(src / name, dest / name)  # copyfile: writable copies of read-only originals
    return dest


def served_tree(multi30k_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(document root, folder inside it laid out like the GitHub repository)."""
    docroot = tmp_path / "www"
    return docroot, copy_dataset(multi30k_dir, docroot / "data/task1/raw")


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:  # one flipped byte inside the compressed stream
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])


def config(tmp_path: Path, root: Path | None = None) -> SimpleNamespace:
    return SimpleNamespace(root=str(root) if root else None, cache_dir=str(tmp_path / "cache"))


def leftovers(folder: Path) -> list[str]:
    """Files in `folder` that are not finished Multi30k files (temporary downloads)."""
    return [p.name for p in folder.iterdir() if p.name not in MULTI30K_FILES] if folder.exists() else []


@pytest.fixture(autouse=True)
def no_local_dir(monkeypatch):
    # CI sets MULTI30K_DIR; these tests decide themselves where the data comes from.
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    monkeypatch.delenv("MULTI30K_URL", raising=False)


def test_download_verifies_writes_and_caches(multi30k_dir, tmp_path, serve, monkeypatch):
    docroot, _ = served_tree(multi30k_dir, tmp_path)
    url, server = serve(docroot)
    folder = resolve_multi30k_dir(config(tmp_path), base_url=url, backoff_s=0)
    assert folder == tmp_path / "cache" / "multi30k"
    for name, digest in MULTI30K_FILES.items():
        assert sha256_file(folder / name) == digest
    assert leftovers(folder) == []
    assert sum(server.requests.values()) == 6
    # Second use: everything verified from the cache, nothing fetched. MULTI30K_URL also works.
    monkeypatch.setenv("MULTI30K_URL", url)
    assert resolve_multi30k_dir(config(tmp_path)) == folder
    assert sum(server.requests.values()) == 6
    src, tgt = read_split(folder, "val", "de", "en")
    assert len(src) == len(tgt) == 1014


@pytest.mark.parametrize("how, message", [("flip", "corrupted or a different version|not a valid gzip"),
                                          ("truncate", "truncated")])
def test_bad_download_is_retried_then_refused_and_never_kept(multi30k_dir, tmp_path, serve, how, message):
    docroot, served = served_tree(multi30k_dir, tmp_path)
    corrupt(served / "train.en.gz", how)
    url, server = serve(docroot)
    with pytest.raises(DataError) as err:
        resolve_multi30k_dir(config(tmp_path), base_url=url, retries=3, backoff_s=0)
    text = str(err.value)
    assert "train.en.gz" in text and "MULTI30K_DIR" in text and "\n" not in text
    assert re.search(message, text)
    assert server.requests["train.en.gz"] == 3  # retried
    cache = tmp_path / "cache" / "multi30k"
    assert not (cache / "train.en.gz").exists()
    assert leftovers(cache) == []


def test_no_network_and_no_local_folder(tmp_path):
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DataError, match=r"cannot download Multi30k file train\.de\.gz .*MULTI30K_DIR"):
        resolve_multi30k_dir(config(tmp_path), base_url=f"http://127.0.0.1:{port}/raw", retries=2, backoff_s=0)
    assert leftovers(tmp_path / "cache" / "multi30k") == []


def test_bad_file_in_the_download_cache_is_replaced(multi30k_dir, tmp_path, serve):
    docroot, _ = served_tree(multi30k_dir, tmp_path)
    url, server = serve(docroot)
    cache = copy_dataset(multi30k_dir, tmp_path / "cache" / "multi30k")
    corrupt(cache / "val.de.gz", "truncate")
    resolve_multi30k_dir(config(tmp_path), base_url=url, backoff_s=0)
    assert sha256_file(cache / "val.de.gz") == MULTI30K_FILES["val.de.gz"]
    assert dict(server.requests) == {"val.de.gz": 1}
    corrupt(cache / "val.de.gz", "truncate")  # and offline: the copy is kept until a verified one replaces it
    damaged = (cache / "val.de.gz").read_bytes()
    with pytest.raises(DataError, match="cannot download Multi30k file val.de.gz"):
        resolve_multi30k_dir(config(tmp_path), base_url="http://127.0.0.1:9/offline", retries=1, backoff_s=0)
    assert (cache / "val.de.gz").read_bytes() == damaged
    assert sorted(p.name for p in cache.iterdir()) == sorted(MULTI30K_FILES)  # no temporary left


@pytest.mark.parametrize("damage, message", [
    ("missing", r"test_2016_flickr\.de\.gz is missing"),
    ("truncate", r"test_2016_flickr\.de\.gz is truncated"),
    ("other", r"test_2016_flickr\.de\.gz is corrupted or a different version"),
])
def test_local_folder_is_verified(multi30k_dir, tmp_path, monkeypatch, damage, message):
    local = copy_dataset(multi30k_dir, tmp_path / "local")
    target = local / "test_2016_flickr.de.gz"
    if damage == "missing":
        target.unlink()
    elif damage == "truncate":
        corrupt(target, "truncate")
    else:  # a valid gzip file with different content
        target.write_bytes(gzip.compress(b"Ein anderer Satz.\n"))
    monkeypatch.setenv("MULTI30K_DIR", str(local))
    with pytest.raises(DataError, match=message + r".*MULTI30K_DIR"):
        resolve_multi30k_dir(config(tmp_path), base_url="http://127.0.0.1:9/never-used")


def test_data_root_wins_over_environment(multi30k_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTI30K_DIR", str(tmp_path / "nowhere"))
    assert resolve_multi30k_dir(config(tmp_path, root=multi30k_dir)) == multi30k_dir
    with pytest.raises(DataError, match="not a folder"):
        resolve_multi30k_dir(config(tmp_path))


def test_read_split_line_count_mismatch_and_line_splitting(tmp_path):
    (tmp_path / "val.de.gz").write_bytes(gzip.compress("Ein Mann\u2028mit Hut. \nZwei Hunde.\nDrei.\n".encode()))
    (tmp_path / "val.en.gz").write_bytes(gzip.compress(b"A man with a hat.\nTwo dogs.\n"))
    with pytest.raises(DataError, match=r"val\.de\.gz has 3 lines but .*val\.en\.gz has 2"):
        read_split(tmp_path, "val", "de", "en")
    (tmp_path / "val.en.gz").write_bytes(gzip.compress(b"A man with a hat.\nTwo dogs.\nThree."))  # no final newline
    src, tgt = read_split(tmp_path, "val", "de", "en")
    assert src == ["Ein Mann\u2028mit Hut.", "Zwei Hunde.", "Drei."]  # U+2028 is not a line break here
    assert tgt == ["A man with a hat.", "Two dogs.", "Three."]


def test_prepare_data_cli_bad_file_is_one_line_and_exit_2(multi30k_dir, tmp_path, monkeypatch, capsys):
    local = copy_dataset(multi30k_dir, tmp_path / "local")
    corrupt(local / "train.de.gz", "truncate")
    monkeypatch.setenv("MULTI30K_DIR", str(local))
    with pytest.raises(SystemExit) as exit_info:  # the command scripts/prepare_data.py runs, in this process
        run("prepare-data", ["--config", "tiny", f"data.cache_dir={tmp_path / 'cache'}"], "prepare_data.py")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ")
    assert "train.de.gz is truncated" in err and "MULTI30K_DIR" in err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing half-built
