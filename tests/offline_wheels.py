"""Wheels made without a package index: this checkout's, built with the installed setuptools, and
those of installed distributions, packed again from the files they installed (their RECORD). So a
fresh virtual environment can `pip install --no-index` the client and what it needs."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement


def repack(name: str, out_dir: Path) -> Path:
    """The installed distribution `name` as a wheel in `out_dir`."""
    dist = metadata.distribution(name)
    wheel_info = dist.read_text("WHEEL") or ""
    tag = next(line.split(":", 1)[1].strip() for line in wheel_info.splitlines() if line.startswith("Tag:"))
    stem = dist.metadata["Name"].replace("-", "_")
    path = out_dir / f"{stem}-{dist.version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        for file in dist.files or ():
            source = Path(dist.locate_file(file))
            if file.parts[0] == ".." or "__pycache__" in file.parts or not source.is_file():
                continue  # scripts outside site-packages and byte code are made again on install
            whl.write(source, str(file))
    return path


def with_dependencies(names: tuple[str, ...]) -> set[str]:
    """`names` and every installed distribution they need, without extras."""
    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name.lower() in found:
            continue
        found.add(name.lower())
        for text in metadata.requires(name) or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def build_own(src: Path, out_dir: Path) -> None:
    """The checkout at `src` as a wheel in `out_dir`, built here: no build isolation, no index."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                           "--no-index", "-w", str(out_dir), str(src)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
