"""Locate the package's data directories (config/, models/, launch/) wherever it is installed.

Order: $LIVOX_INFER_SHARE, the ament share directory (colcon install or pip install with
data_files), then the source tree (editable install / running from a checkout).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE = "livox_infer"


def _candidates() -> list[Path]:
    out: list[Path] = []
    env = os.environ.get("LIVOX_INFER_SHARE")
    if env:
        out.append(Path(env))
    # Source tree first when running from a checkout, so edits to config/ take effect at once.
    src_root = Path(__file__).resolve().parent.parent
    if (src_root / "package.xml").is_file():
        out.append(src_root)
    try:  # ROS install (colcon) or pip with data_files registered in the ament index
        from ament_index_python.packages import get_package_share_directory

        out.append(Path(get_package_share_directory(PACKAGE)))
    except Exception:  # noqa: BLE001 - ament index absent or package not registered
        pass
    out.append(Path(sys.prefix) / "share" / PACKAGE)
    return out


def models_dirs() -> list[Path]:
    """Every models/ directory the package may load configs and weights from (training must not write there)."""
    return [c / "models" for c in _candidates() if (c / "models").is_dir()]


def share_dir() -> Path:
    """The first directory that holds this package's data (config/ and models/)."""
    for c in _candidates():
        if (c / "models").is_dir() and (c / "config").is_dir():
            return c
    raise FileNotFoundError(
        f"cannot find the {PACKAGE} data directories (config/, models/); looked in: "
        + ", ".join(str(c) for c in _candidates())
        + ". Set LIVOX_INFER_SHARE to the package's share directory."
    )


def find(kind: str, name: str) -> Path:
    """Resolve ``name`` (a path, or a bare file name inside share/<kind>/)."""
    p = Path(name).expanduser()
    if p.is_file():
        return p
    q = share_dir() / kind / name
    if q.is_file():
        return q
    raise FileNotFoundError(f"{kind} file not found: {name!r} (also looked for {q})")
