"""Small file-system helpers shared by checkpoints, downloads and the data cache."""

from __future__ import annotations

import os
from pathlib import Path


def current_umask() -> int:
    """The process umask (reading it means setting it, so it is set straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def give_default_permissions(path: str | Path) -> None:
    """Give a file or folder tree made by mkstemp/mkdtemp (owner-only) what a plain open()/mkdir() would.

    Without this a shared cache or run directory written by one user stays unreadable to others.
    """
    path = Path(path)
    umask = current_umask()
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)
