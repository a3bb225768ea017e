"""`livox-infer export`: AOTInductor package (.pt2) of network + top-k decoding, for machines without a compiler.

``torch.compile`` needs a C++ compiler and Python headers on the robot and compiles at every
start-up (cache permitting). An AOTInductor package is compiled once, here, into a shared library
plus the weights; the robot only loads it (``DetectionPipeline(aoti_package=...)``, node parameter
``aoti_package``, ``livox-infer detect --aoti-package``). Same static shapes, channels_last and folded
BatchNorm as the compiled path.

The package is native code (a shared library whose constructors run when it is loaded), so it is
trusted like code: `export_package` records the sha256 of every package it writes in a manifest
(`manifest_path()`: ``$LIVOX_INFER_AOTI_MANIFEST``, else ``$XDG_CONFIG_HOME/livox_infer/aoti_manifest.json``,
else ``~/.config/livox_infer/aoti_manifest.json``), and `AotiRunner` refuses any package whose bytes hash
to a value not listed there, before any of it is loaded. The checked bytes are copied into a private
temporary directory and loaded from there (no swap between check and load), and torch's extraction
goes into that directory too, which is removed afterwards. To deploy on another machine, copy the
package and merge its manifest entry (docs/detector.md, "Trust model"). A package is also tied to the
model config it was exported with (architecture hash in its metadata, checked at load), to the CPU
ISA / GPU it was built for, and to the torch version (re-export after upgrading torch).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from livox_infer.errors import ConfigError, LivoxInferError, WeightsError
from livox_infer.model.config import ModelConfig
from livox_infer.threads import add_threads_argument
from livox_infer.model.postprocess import build_inference_model

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


def export_package(cfg: ModelConfig, weights: str | Path, out: str | Path, device: str = "cpu",
                   test_time_flip: bool = False) -> Path:
    """Export ``cfg`` + ``weights`` to an AOTInductor package at ``out``; returns its path."""
    from livox_infer.voxelize.voxelizer import resolve_device

    dev = resolve_device(device)
    weights = Path(weights)
    infer, meta = build_inference_model(cfg, weights, dev, flip=test_time_flip)
    example = torch.zeros((1, *cfg.grid.shape), device=dev).contiguous(memory_format=torch.channels_last)
    metadata = {
        "format": PACKAGE_FORMAT,
        "config_name": cfg.name,
        "architecture_hash": cfg.architecture_hash(),
        "weights_file": weights.name,
        "weights_sha256": file_sha256(weights),
        "trained": meta.get("trained", "no"),
        "torch_version": torch.__version__,
        "device_type": dev.type,
        "test_time_flip": "yes" if test_time_flip else "no",
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        program = torch.export.export(infer, (example,), strict=False)
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=str(out), inductor_configs={"aot_inductor.metadata": metadata}
        )
    record_in_manifest(Path(path), {k: metadata[k] for k in ("config_name", "weights_sha256", "device_type")})
    return Path(path)


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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="lite", help="model config name (models/<name>.yaml) or path")
    p.add_argument("--weights", default=None, help="safetensors weights (default: the config's)")
    p.add_argument("--device", default="cpu", help="cpu | cuda: what the package will run on")
    p.add_argument("--out", default=None, help="package path (default: <config>.<device>.pt2 in the current directory)")
    p.add_argument("--test-time-flip", action="store_true",
                   help="bake in test-time flipping (frame + mirror image, averaged); the pipeline must set it too")
    p.add_argument("--check", action="store_true", help="load the package and compare it with the eager network")
    add_threads_argument(p)  # inductor bakes the thread count into the package's kernels


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = ModelConfig.load(args.config)
        if args.device not in ("cpu", "cuda") and not str(args.device).startswith("cuda:"):
            raise ConfigError(f"--device must be cpu or cuda, got {args.device!r}")
        weights = Path(args.weights) if args.weights else cfg.weights_path()
        out = Path(args.out or f"{cfg.name}.{str(args.device).split(':')[0]}.pt2")
        t0 = time.time()
        path = export_package(cfg, weights, out, args.device, args.test_time_flip)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) in {time.time() - t0:.0f} s; "
              f"its sha256 is recorded as trusted in {manifest_path()}")
        if args.check:
            print(check_package(path, cfg, weights, args.device, args.test_time_flip))
    except LivoxInferError as exc:
        print(f"livox-infer export: {exc}", file=sys.stderr)
        return 2
    return 0


def check_package(path: Path, cfg: ModelConfig, weights: Path, device: str = "cpu", flip: bool = False,
                  iters: int = 20) -> str:
    """Largest output difference vs the eager module on a random BEV, and the time per call of both."""
    from livox_infer.voxelize.voxelizer import resolve_device

    dev = resolve_device(device)
    runner = AotiRunner(path, cfg, dev, flip)
    infer, _ = build_inference_model(cfg, weights, dev, flip=flip)
    x = torch.rand((1, *cfg.grid.shape), device=dev).contiguous(memory_format=torch.channels_last)
    out: dict[str, Any] = {}
    with torch.no_grad():
        a, b = infer(x), runner(x)
        out["max_abs_diff"] = max(float((u.float() - v.float()).abs().max()) for u, v in zip(a, b))
        for name, fn in (("eager_ms", infer), ("package_ms", runner)):
            t = time.perf_counter()
            for _ in range(iters):
                fn(x)
            out[name] = round((time.perf_counter() - t) / iters * 1000, 2)
    return ", ".join(f"{k} {v}" for k, v in out.items())
