"""`livox-infer export`: AOTInductor package (.pt2) of network + top-k decoding (and, on a CPU, stage 2's costly parts),
for machines without a compiler.

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

from torch._inductor.package import package_aoti

from livox_infer.detector.aoti import (
    NMS_PART, STAGE2_LARGE_PART, STAGE2_PARTS, AotiRunner, manifest_path, record_in_manifest,
)
from livox_infer.errors import ConfigError, LivoxInferError
from livox_infer.detector.config import ModelConfig
from livox_infer.params import BY_NAME, DEFAULTS, PRECISIONS, SENSOR_PRESETS
from livox_infer.detector.precision import resolve_precision
from livox_infer.threads import add_threads_argument
from livox_infer.detector.postprocess import build_inference_model

log = logging.getLogger("livox_infer.export")





def export_package(cfg: ModelConfig, weights: str | Path, out: str | Path | None, device: str = "cpu",
                   test_time_flip: bool = False, precision: str = "auto") -> Path:
    """Export ``cfg`` + ``weights`` to an AOTInductor package at ``out``; returns its path. ``out`` None: install
    it into this machine's packages folder (livox_infer.cache.packages_dir) under the name the pipeline looks
    for (`livox_infer.detector.aoti.find_package`), with its match fields beside it (``.json``).

    On CPU inductor freezes the weights into the package and pre-packs them for oneDNN (docs/performance.md:
    the package's network is ~0.75x eager, without freezing ~1x)."""
    import json

    from livox_infer.cache import inductor_cache_dir, packages_dir
    from livox_infer.detector.aoti import package_fields, package_name
    from livox_infer.voxelize.voxelizer import resolve_device

    inductor_cache_dir()
    dev = resolve_device(device)
    precision = resolve_precision(precision, dev)
    weights = Path(weights)
    infer, meta = build_inference_model(cfg, weights, dev, flip=test_time_flip, precision=precision)
    example = torch.zeros((1, *cfg.grid.shape), device=dev).contiguous(memory_format=torch.channels_last)
    fields = package_fields(cfg, weights, dev, test_time_flip, precision)
    metadata = {**fields, "weights_file": weights.name, "trained": meta.get("trained", "no")}
    install = out is None
    out = packages_dir() / package_name(fields) if install else Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage2 = cfg.refine is not None and dev.type == "cpu"  # (stage 2 in a CUDA package: not run without a GPU)
    if stage2:
        metadata.update(stage2_metadata(cfg))
    if dev.type == "cpu":
        metadata["nms"] = NMS_PART
    configs: dict[str, Any] = {"aot_inductor.metadata": metadata, "aot_inductor.package": True}
    if dev.type == "cpu":
        configs["freezing"] = True
    with torch.no_grad():
        program = torch.export.export(infer, (example,), strict=False)
        parts = {"model": torch._inductor.aot_compile(program.module(), (example,), options=configs)}
        if stage2:
            parts.update(_stage2_parts(infer.net.refiner, cfg, dev))
            if cfg.refine_large is not None:
                parts[STAGE2_LARGE_PART] = _pass_part(infer.net.refiner_large, cfg.refine_large, cfg, dev,
                                                      prefix="refine_large")
        if dev.type == "cpu":
            parts[NMS_PART] = _nms_part(dev)
        path = str(package_aoti(str(out), parts))
    record_in_manifest(Path(path), {k: metadata[k] for k in ("config_name", "weights_sha256", "device_type")})
    if install:
        side = Path(path).with_suffix(".json")
        side.write_text(json.dumps(metadata, indent=1, sort_keys=True), encoding="utf-8")
    return Path(path)


def stage2_metadata(cfg: ModelConfig) -> dict[str, str]:
    """What a package's stage-2 parts were compiled with (`livox_infer.detector.aoti.PackageStage2` checks each call)."""
    out = {"stage2": STAGE2_PARTS}
    for prefix, rc in (("stage2", cfg.refine), ("stage2_large", cfg.refine_large)):
        if rc is not None:
            out.update({f"{prefix}_rois": str(rc.rois), f"{prefix}_points": str(rc.points),
                        f"{prefix}_margin": repr(float(rc.margin)),
                        f"{prefix}_intensity_scale": repr(float(cfg.grid.intensity_scale))})
    if cfg.refine_large is not None:
        out["stage2_large"] = STAGE2_LARGE_PART
    return out


def _stage2_parts(refiner: torch.nn.Module, cfg: ModelConfig, dev: torch.device) -> dict[str, list]:
    """Stage 2's costly parts compiled ahead of time beside the network (the torch.compile path's `CompiledRefiner`):
    the point features with dynamic point and box counts (points: at least the sampled count, at most
    MAX_NEAR_POINTS; boxes: 2 to rois, as a compiled graph specialises 0 and 1), the refiner at (rois, points), and
    a whole refinement pass (`_pass_part`), which every frame with a candidate runs (`refine_candidates` fills its
    candidates up to rois)."""
    from torch.export import Dim

    from livox_infer.detector.refine import MAX_NEAR_POINTS, SampledFeatures, refiner_example_inputs

    rc = cfg.refine
    n = max(rc.points, 256)
    points = torch.rand((n, 4), device=dev) * 10.0
    boxes = torch.tensor([[2.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.3]] * rc.rois, device=dev)
    feats_args = (points, torch.arange(n, device=dev), boxes)
    n_points = Dim("points", min=rc.points, max=MAX_NEAR_POINTS)  # the points and their indices: one size
    dims = ({0: n_points}, {0: n_points}, {0: Dim("boxes", min=2, max=rc.rois)})
    refiner_args = refiner_example_inputs(rc, cfg.num_classes, dev)
    features = SampledFeatures(rc.points, rc.margin, cfg.grid.intensity_scale)
    package = {"aot_inductor.package": True}
    out = {}
    for name, module, args, shapes, opts in (
            ("stage2_features", features, feats_args, dims, package),
            ("stage2_refiner", refiner.eval(), refiner_args, None, {**package, "freezing": True})):
        program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
        out[name] = torch._inductor.aot_compile(program.module(), args, options=opts)
    out["stage2_pass"] = _pass_part(refiner, rc, cfg, dev)
    return out


class _Prefixed(torch.nn.Module):
    """A `RefinePass` ``inner`` under the attribute ``name``: the parts of one package share one namespace of constants (named
    after the module's attributes), so refine_large's pass, whose attributes are the first pass's, would otherwise
    load the first refiner's weights (or give it its own)."""

    def __init__(self, name: str, inner: torch.nn.Module) -> None:
        super().__init__()
        self.name = name
        self.add_module(name, inner)

    def forward(self, points: torch.Tensor, near: torch.Tensor, boxes: torch.Tensor, scores: torch.Tensor,
                labels: torch.Tensor, first: torch.Tensor | None = None, observed: torch.Tensor | None = None):
        return getattr(self, self.name)(points, near, boxes, scores, labels, first, observed)


def _pass_part(refiner: torch.nn.Module, rc, cfg: ModelConfig, dev: torch.device, prefix: str | None = None) -> list:
    """A whole refinement pass of ``refiner`` with its section ``rc`` (`RefinePass`: rois boxes, dynamic point count)
    compiled ahead of time: the first refiner's "stage2_pass", refine_large's STAGE2_LARGE_PART (``prefix``: the
    attribute its weights are named under)."""
    from torch.export import Dim

    from livox_infer.detector.refine import MAX_NEAR_POINTS, VIS_AZIMUTH_BINS, RefinePass

    n = max(rc.points, 256)
    points = torch.rand((n, 4), device=dev) * 10.0
    boxes = torch.tensor([[2.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.3]] * rc.rois, device=dev)
    n_points = Dim("points", min=rc.points, max=MAX_NEAR_POINTS)
    # rois boxes (a fixed count: the refiner's), their stage-1 scores and labels, [the hit map]
    args = (points, torch.arange(n, device=dev), boxes, torch.linspace(0.9, 0.1, rc.rois, device=dev),
            torch.arange(rc.rois, device=dev) % cfg.num_classes)
    if rc.visibility:
        args += (torch.full((VIS_AZIMUTH_BINS,), 30.0, device=dev),
                 torch.ones(VIS_AZIMUTH_BINS, dtype=torch.bool, device=dev))
    shapes = ({0: n_points}, {0: n_points}) + (None,) * (len(args) - 2)
    module = RefinePass(refiner.eval(), rc, cfg.num_classes, cfg.grid.intensity_scale).eval()
    if prefix:
        module = _Prefixed(prefix, module).eval()
    program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
    return torch._inductor.aot_compile(program.module(), args,
                                       options={"aot_inductor.package": True, "freezing": True})


def _nms_part(dev: torch.device) -> list:
    """The NMS's overlap clipping compiled for any count of box pairs from 2 (a CPU package's part: ~60 small ops
    eagerly, 1.3 of the 2 ms of the postprocess)."""
    from torch.export import Dim

    from livox_infer.detector.boxes import PairedIntersectionArea, bev_corners

    boxes = torch.tensor([[0.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.3], [1.0, 0.5, 0.0, 4.2, 1.9, 1.5, 0.1]] * 4,
                         dtype=torch.float64, device=dev)
    corners = bev_corners(boxes)
    args = (corners, corners.flip(0).contiguous())
    pairs = Dim("pairs", min=2, max=1 << 16)
    program = torch.export.export(PairedIntersectionArea(), args, dynamic_shapes=({0: pairs}, {0: pairs}),
                                  strict=False)
    return torch._inductor.aot_compile(program.module(), args, options={"aot_inductor.package": True})


def add_arguments(p: argparse.ArgumentParser) -> None:
    # --model as in every other command; --config, the older spelling, is what the docs show
    p.add_argument("--model", "--config", dest="model", default=DEFAULTS["model"],
                   help="model config name (models/<name>.yaml) or path (default %(default)s)")
    p.add_argument("--weights", default=None, help="safetensors weights (default: the config's)")
    p.add_argument("--device", default="cpu", help="cpu | cuda: what the package will run on")
    p.add_argument("--sensor", default=None, choices=SENSOR_PRESETS,
                   help="export for this sensor preset's detection grid (its bev_extent; config/<sensor>.param.yaml), "
                        "as `livox-infer run --sensor` and `detect --sensor` use it (default: the model's grid)")
    p.add_argument("--bev-extent", type=float, nargs=4, metavar=("X_MIN", "X_MAX", "Y_MIN", "Y_MAX"), default=None,
                   help="export for this detection grid (m; wins over --sensor's)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", default=None,
                       help="package path (default: <config>[.<sensor>].<device>.pt2 in the current directory)")
    where.add_argument("--install", action="store_true",
                       help="put the package into this machine's package folder (~/.cache/livox_infer/packages, "
                            "LIVOX_INFER_CACHE_DIR), where the node and detect find it without being told")
    p.add_argument("--if-missing", action="store_true",
                   help="with --install: do nothing when a package matching this model, grid, weights, threads, CPU "
                        "and torch version is installed already")
    p.add_argument("--test-time-flip", action="store_true",
                   help="bake in test-time flipping (frame + mirror image, averaged); the pipeline must set it too")
    p.add_argument("--precision", default=DEFAULTS["precision"], choices=PRECISIONS,
                   help=f"{BY_NAME['precision'].doc} (default %(default)s)")
    p.add_argument("--check", action="store_true", help="load the package and compare it with the eager network")
    # the pipeline's background build (livox_infer/detector/package_build.py): lowest priority, ends with that process
    p.add_argument("--background-of", type=int, default=None, metavar="PID", help=argparse.SUPPRESS)
    add_threads_argument(p)  # inductor bakes the thread count into the package's kernels


def export_config(args: argparse.Namespace) -> ModelConfig:
    """The model config with the grid the package is for: --bev-extent, else --sensor's preset grid, else the model's."""
    cfg = ModelConfig.load(args.model)
    extent = getattr(args, "bev_extent", None)
    if extent is None and getattr(args, "sensor", None):
        from livox_infer.presets import preset_pipeline_options

        extent = preset_pipeline_options(args.sensor).get("bev_extent")
    return cfg.with_extent(extent) if extent is not None else cfg


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = export_config(args)
        if args.device not in ("cpu", "cuda") and not str(args.device).startswith("cuda:"):
            raise ConfigError(f"--device must be cpu or cuda, got {args.device!r}")
        weights = Path(args.weights) if args.weights else cfg.weights_path()
        sensor = f".{args.sensor}" if args.sensor and args.bev_extent is None else ""
        out = None if args.install else Path(args.out or f"{cfg.name}{sensor}.{str(args.device).split(':')[0]}.pt2")
        if (args.if_missing or args.background_of) and not args.install:
            raise ConfigError("--if-missing goes with --install")
        if args.if_missing or args.background_of:
            from livox_infer.detector.aoti import find_package, package_fields, package_name
            from livox_infer.voxelize.voxelizer import resolve_device

            fields = package_fields(cfg, weights, resolve_device(args.device), args.test_time_flip,
                                    resolve_precision(args.precision, resolve_device(args.device)))
            found, _ = find_package(fields)
            if found is not None:
                print(f"{found} matches already (model, grid, weights, threads, CPU, torch): nothing to do")
                return 0
        t0 = time.time()
        locked = None  # the package path whose build lock this (background) export holds
        if args.background_of:
            from livox_infer.cache import packages_dir
            from livox_infer.detector import package_build

            if not package_build.become_background_of(args.background_of):
                print(f"process {args.background_of} has ended: no background build")
                return 0
            target = packages_dir() / package_name(fields)
            if not package_build.take_lock(target):
                print(f"another process builds {target} already (lock {package_build.lock_path(target)})")
                return package_build.LOCKED_EXIT
            locked = target
        try:
            path = export_package(cfg, weights, out, args.device, args.test_time_flip, args.precision)
        finally:
            if locked is not None:
                package_build.release_lock(locked)
        (x0, x1), (y0, y1) = cfg.grid.x_range, cfg.grid.y_range
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, grid x {x0:g}..{x1:g} m, y {y0:g}..{y1:g} m, "
              f"{torch.get_num_threads()} threads) in {time.time() - t0:.0f} s; its sha256 is recorded as trusted in "
              f"{manifest_path()}")
        if args.check:
            print(check_package(path, cfg, weights, args.device, args.test_time_flip, args.precision))
    except LivoxInferError as exc:
        print(f"livox-infer export: {exc}", file=sys.stderr)
        return 2
    return 0


def check_package(path: Path, cfg: ModelConfig, weights: Path, device: str = "cpu", flip: bool = False,
                  precision: str = "auto", iters: int = 20) -> str:
    """Largest output difference vs the eager module (same precision) on a random BEV, and the time per call of both."""
    from livox_infer.voxelize.voxelizer import resolve_device

    dev = resolve_device(device)
    precision = resolve_precision(precision, dev)
    runner = AotiRunner(path, cfg, dev, flip, precision)
    infer, _ = build_inference_model(cfg, weights, dev, flip=flip, precision=precision)
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
