"""The one folder where livox_infer keeps what it builds for this machine, so a second start reuses it.

``$LIVOX_INFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/livox_infer``, else ``~/.cache/livox_infer``:

- ``inductor/``: torch.compile's compiled graphs and kernels. ``TORCHINDUCTOR_CACHE_DIR`` is pointed here when
  ``livox_infer`` is imported (a value set in the environment wins, except torch's own ``/tmp/torchinductor_<user>``,
  which torch writes into the environment the first time inductor is imported and which used to win by accident).
- ``packages/``: AOTInductor packages built for this machine (``make package``,
  ``livox-infer export --install``), found by `livox_infer.detector.aoti.find_package`.
- ``precompiled/``: torch.compile's compiled functions saved by a start that compiled, so the next start loads them
  without tracing (`livox_infer.detector.precompiled`).

The node, ``livox-infer detect``, the benches, the Makefile and ``scripts/device_check.sh`` all use this
function; none of them names another folder.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE_ENV = "LIVOX_INFER_CACHE_DIR"
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "livox_infer"


def _is_torch_default(path: str) -> bool:
    """torch's fallback cache folder (tempdir/torchinductor_<user>), which torch also writes into the environment."""
    p = Path(path)
    return p.name.startswith("torchinductor_") and p.parent == Path(tempfile.gettempdir())


def inductor_cache_dir() -> Path:
    """torch.compile's cache: ``$TORCHINDUCTOR_CACHE_DIR`` when the user set it, else ``<cache_root>/inductor``; the
    variable is set to the answer, so torch and the compile workers it starts use the same folder."""
    current = os.environ.get(INDUCTOR_ENV)
    if not current or _is_torch_default(current):
        current = str(cache_root() / "inductor")
        os.environ[INDUCTOR_ENV] = current
    return Path(current)


def packages_dir() -> Path:
    """Where the AOTInductor packages built for this machine live."""
    return cache_root() / "packages"


def precompiled_dir() -> Path:
    """Where torch.compile's saved compiled functions live (`livox_infer.detector.precompiled`)."""
    return cache_root() / "precompiled"
