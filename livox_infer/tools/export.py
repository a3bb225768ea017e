"""`livox-infer export`: AOTInductor package (.pt2) of network + top-k decoding, for machines without a compiler.

``torch.compile`` needs a C++ compiler and Python headers on the robot and compiles at every
start-up (cache permitting). An AOTInductor package is compiled once, here, into a shared library
plus the weights; the robot only loads it (``DetectionPipeline(aoti_package=...)``, node parameter
``aoti_package``, ``livox-infer detect --aoti-package``) through `livox_infer.detector.aoti`, which checks
it against the manifest this command writes. Same static shapes, channels_last and folded BatchNorm as
the compiled path. To deploy on another machine, copy the package and merge its manifest entry.
"""


from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch

from livox_infer.detector.aoti import (
    PACKAGE_FORMAT, AotiRunner, file_sha256, manifest_path, record_in_manifest,
)
from livox_infer.errors import ConfigError, LivoxInferError
from livox_infer.detector.config import ModelConfig
from livox_infer.params import DEFAULTS
from livox_infer.threads import add_threads_argument
from livox_infer.detector.postprocess import build_inference_model

log = logging.getLogger("livox_infer.export")





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


def add_arguments(p: argparse.ArgumentParser) -> None:
    # --model as in every other command; --config, the older spelling, is what the docs show
    p.add_argument("--model", "--config", dest="model", default=DEFAULTS["model"],
                   help="model config name (models/<name>.yaml) or path (default %(default)s)")
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
        cfg = ModelConfig.load(args.model)
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
