"""Build a node program as one reproducible single-file zipapp.

``python -m gpufleet_node.build OUTPUT [--app slurm_exporter]`` writes OUTPUT: a
``#!/usr/bin/python3`` line and a zip of this package's modules (the ones git tracks, in a
checkout; sorted, fixed timestamps and modes, stored uncompressed, no ``__pycache__``),
whose ``__main__`` runs the app. The same
source gives the same bytes on any controller (no zlib version in the output), so the
copy to the nodes stays ``changed=0`` on reruns. OUTPUT is replaced atomically and only
when its bytes change.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
APPS = ("slurm_exporter", "gpu_collector", "gpu_health", "job_summary")
SHEBANG = b"#!/usr/bin/python3\n"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold
# Controller-side only: the builder itself is not shipped.
EXCLUDE = ("build.py",)


def _tracked(package: Path) -> list[Path] | None:
    """The package's ``*.py`` files that git tracks; None outside a git checkout.

    A scratch module or a stray copy left in a developer's tree is not shipped to the
    nodes. A checkout that tracks none of them (the package copied into some other
    repository) counts as no checkout.
    """
    try:
        listed = subprocess.run(
            ["git", "-C", str(package), "ls-files", "-z", "--", "*.py"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # Tracked but deleted in the working tree: not part of what is built.
    found = [package / os.fsdecode(name) for name in listed.split(b"\0") if name]
    found = [path for path in found if path.is_file()]
    return found or None


def sources(package: Path = PACKAGE) -> list[Path]:
    """The package's modules, in a fixed order, relative to the package's parent.

    In a git checkout, the tracked ones; otherwise (an sdist, a copy) every one.
    """
    candidates = _tracked(package)
    if candidates is None:
        candidates = list(package.rglob("*.py"))
    found = [
        path.relative_to(package.parent)
        for path in candidates
        if "__pycache__" not in path.parts and path.name not in EXCLUDE
    ]
    return sorted(found, key=lambda p: p.as_posix())


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o100644 << 16
    info.create_system = 3  # unix, whatever the building OS
    return info


def archive(app: str, package: Path = PACKAGE) -> bytes:
    """The zipapp's bytes for ``app`` (one of APPS)."""
    if app not in APPS:
        raise ValueError(f"unknown app {app!r}; one of {', '.join(APPS)}")
    buf = io.BytesIO()
    buf.write(SHEBANG)
    with zipfile.ZipFile(buf, "w") as zf:
        main = f"import sys\n\nfrom {package.name}.{app}.cli import main\n\nsys.exit(main())\n"
        zf.writestr(_entry("__main__.py"), main)
        for rel in sources(package):
            zf.writestr(_entry(rel.as_posix()), (package.parent / rel).read_bytes())
    return buf.getvalue()


def write(output: Path, data: bytes) -> bool:
    """Write ``data`` to ``output`` atomically, mode 0644; False when it already holds it."""
    if output.is_file() and output.read_bytes() == data:
        return False
    fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpufleet_node.build", description=__doc__)
    p.add_argument("output", type=Path)
    p.add_argument("--app", choices=APPS, default="slurm_exporter")
    args = p.parse_args(argv)
    data = archive(args.app)
    changed = write(args.output, data)
    print(f"{'changed' if changed else 'unchanged'} {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
