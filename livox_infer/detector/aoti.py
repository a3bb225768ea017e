"""Loading an AOTInductor package (.pt2 from `livox-infer export`) as code that is trusted explicitly.

The package is native code (a shared library whose constructors run when it is loaded), so it is
trusted like code: `livox_infer.tools.export.export_package` records the sha256 of every package it writes
in a manifest (`manifest_path()`: ``$LIVOX_INFER_AOTI_MANIFEST``, else
``$XDG_CONFIG_HOME/livox_infer/aoti_manifest.json``, else ``~/.config/livox_infer/aoti_manifest.json``), and
`AotiRunner` refuses any package whose bytes hash to a value not listed there, before any of it is loaded.
The checked bytes are copied into a private temporary directory and loaded from there (no swap between
check and load), and torch's extraction goes into that directory too, which is removed afterwards. A
package is also tied to the model config it was exported with (architecture hash in its metadata, checked
at load), to the CPU ISA / GPU it was built for, and to the torch version (re-export after upgrading torch).
"""


from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from livox_infer.errors import WeightsError
from livox_infer.detector.config import ModelConfig

log = logging.getLogger("livox_infer.export")
PACKAGE_FORMAT = "livox_infer.aoti.v1"
MANIFEST_FORMAT = "livox_infer.aoti_manifest.v1"
MANIFEST_ENV = "LIVOX_INFER_AOTI_MANIFEST"
MAX_PACKAGE_BYTES = 1 << 30  # a lite package is ~1 MB; nothing legitimate comes near this



def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest_path() -> Path:
    """Where the list of trusted packages (sha256 of each package `export_package` wrote) lives."""
    if os.environ.get(MANIFEST_ENV):
        return Path(os.environ[MANIFEST_ENV])
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "livox_infer" / "aoti_manifest.json"


def read_manifest(path: Path | None = None) -> dict[str, dict]:
    """{sha256: entry} of the trusted packages; empty when there is no (readable) manifest."""
    path = path or manifest_path()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    packages = doc.get("packages") if isinstance(doc, dict) and doc.get("format") == MANIFEST_FORMAT else None
    return packages if isinstance(packages, dict) else {}


def record_in_manifest(package: Path, entry: dict[str, str], path: Path | None = None) -> Path:
    """Add ``package``'s sha256 to the manifest (atomically replaced); returns the manifest's path."""
    path = path or manifest_path()
    packages = read_manifest(path)
    packages[file_sha256(package)] = {**entry, "file": package.name,
                                      "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"format": MANIFEST_FORMAT, "packages": packages}, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(path)
    return path


def _trusted_bytes(path: Path) -> bytes:
    """The package's bytes, if their sha256 is in the manifest; WeightsError (nothing loaded) otherwise."""
    refused = WeightsError(f"cannot load AOTInductor package {path}: only packages `livox-infer export` wrote "
                           f"(sha256 listed in {manifest_path()}) are loaded")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PACKAGE_BYTES + 1)
    except OSError:
        raise refused from None
    if len(data) > MAX_PACKAGE_BYTES or hashlib.sha256(data).hexdigest() not in read_manifest():
        raise refused
    return data


def _check_metadata(meta: dict[str, str], path: Path, cfg: ModelConfig, device: torch.device, flip: bool) -> None:
    """A package of this project, for this architecture, device and test-time flip setting, or WeightsError."""
    if meta.get("format") != PACKAGE_FORMAT:
        raise WeightsError(f"{path}: not a livox_infer package (format={meta.get('format')!r})")
    if meta.get("architecture_hash") != cfg.architecture_hash():
        raise WeightsError(
            f"{path} was exported for model config {meta.get('config_name')!r} with another architecture "
            f"than {cfg.source or cfg.name}; export it again with this config"
        )
    if meta.get("device_type") != device.type:
        raise WeightsError(f"{path} was built for {meta.get('device_type')}, the pipeline runs on {device.type}")
    if meta.get("test_time_flip", "no") != ("yes" if flip else "no"):
        raise WeightsError(f"{path} was exported with test_time_flip={meta.get('test_time_flip', 'no')}; "
                           "export it again or change test_time_flip")
    if meta.get("torch_version") != torch.__version__:
        log.warning("%s was exported with torch %s, running torch %s: re-export if it misbehaves",
                    path, meta.get("torch_version"), torch.__version__)


@contextlib.contextmanager
def _private_tmpdir():
    """A fresh private directory that is also $TMPDIR while the block runs (torch extracts a package under
    $TMPDIR/aotinductor_*), removed with everything in it afterwards, also when loading failed."""
    root = tempfile.mkdtemp(prefix="livox_infer_aoti_")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = root
    try:
        yield Path(root)
    finally:
        if old is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old
        shutil.rmtree(root, ignore_errors=True)


class AotiRunner:
    """A loaded package, callable like the InferenceModel: (1, C, H, W) -> (scores, labels, boxes)."""

    def __init__(self, path: str | Path, cfg: ModelConfig, device: torch.device, flip: bool = False) -> None:
        path = Path(path)
        data = _trusted_bytes(path)  # before any native code of it is loaded
        with _private_tmpdir() as private:
            copy = private / "package.pt2"  # the checked bytes, out of reach of whoever wrote `path`
            copy.write_bytes(data)
            try:
                self._model = torch._inductor.aoti_load_package(str(copy))
                meta = dict(self._model.get_metadata())
            except Exception as exc:  # noqa: BLE001 - a foreign/corrupt zip, wrong platform, missing symbols
                raise WeightsError(f"{path} is not a loadable AOTInductor package: {type(exc).__name__}: {exc}") from exc
            _check_metadata(meta, path, cfg, device, flip)
            with torch.no_grad():  # one call while the extracted files exist: GPU kernel files load at first use
                self._model(torch.zeros((1, *cfg.grid.shape), device=device).contiguous(memory_format=torch.channels_last))
        self.path = path
        self.metadata = meta

    def __call__(self, bev: torch.Tensor):
        return tuple(self._model(bev))


# --------------------------------------------------------------------------- CLI
