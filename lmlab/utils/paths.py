"""Where lmlab looks for installed data and keeps its caches."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """lmlab's cache directory (``$LMLAB_CACHE``, else ``~/.cache/lmlab``)."""
    root = os.environ.get("LMLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lmlab")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def find_system_path(relative: str) -> Path | None:
    """First existing ``root/relative`` (``relative`` may be a glob) over the roots holding
    Debian data packages: ``/`` (installed with apt-get), then the folder where
    ``scripts/setup.sh`` unpacks packages it does not install (``$LMLAB_DEBIAN_ROOT``, else
    ``~/.cache/lmlab/debian``)."""
    relative = relative.lstrip("/")
    unpacked = os.environ.get("LMLAB_DEBIAN_ROOT") or os.path.join(
        os.path.expanduser("~"), ".cache", "lmlab", "debian")
    for root in (Path("/"), Path(unpacked)):
        if any(ch in relative for ch in "*?["):
            matches = sorted(root.glob(relative))
            if matches:
                return matches[0]
        else:
            candidate = root / relative
            if candidate.exists():
                return candidate
    return None


def package_file(distribution: str, relative: str) -> Path | None:
    """Path of a file shipped inside an installed Python distribution, or None."""
    from importlib import metadata

    try:
        path = Path(str(metadata.distribution(distribution).locate_file(relative)))
    except metadata.PackageNotFoundError:
        return None
    return path if path.exists() else None
