"""``python -m livox_infer.bench.device_check``: everything a lent GPU has to answer, in one run.

Run by ``scripts/device_check.sh`` (the one command to run on a machine with an NVIDIA GPU):

1. environment: torch, CUDA, GPU (none: one line, exit status 2);
2. voxelizer: the Triton op, its CUDA graph and torch.compile of it == the CPU reference, bit for bit;
3. pipeline boxes on the GPU (eager, compiled, CUDA graphs, and the fast path: an AOTInductor package exported for
   this GPU here, in a private folder and manifest) == CPU eager within tolerance, per frame;
4. CUDA graphs engage: ``CUDAGraph.replay`` calls counted while the CUDA-graphs pipeline runs (>= 1 per frame);
5. tables: voxelize latency per frame vs the torch.compile'd reference at 24k / 100k / 1M points, and
   end-to-end host points -> boxes (H2D copy included) eager vs compiled vs CUDA graphs vs package.

Exit status 0 when every check passes, 1 when one fails. ``--device cpu --small`` runs the same steps on
the CPU with small clouds and the eager pipeline only (what the CPU tests run to keep this script working).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import tempfile
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from livox_infer.bench.table import format_table
from livox_infer.errors import BackendError, LivoxInferError

PIPELINE_MODES = ("eager", "compiled", "cuda graphs", "package")
CENTRE_TOL_M = 0.05  # box centre, GPU vs CPU (TF32 convolutions move boxes by millimetres)
SCORE_TOL = 0.02
VOXELIZE_SIZES = "24000,100000,1000000"
SMALL_VOXELIZE_SIZES = "2000,24000"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"),
                   help="cuda (default; no GPU: one line, exit 2) or cpu (a dry run of the same steps)")
    p.add_argument("--small", action="store_true",
                   help="quick run: small clouds, no compile, eager pipeline only (the CPU tests use it)")
    p.add_argument("--model", default="lite", help="model config of the pipeline checks (needs its weights)")
    p.add_argument("--frames", type=int, default=5, help="simulated Avia frames for the box check")
    p.add_argument("--iters", type=int, default=200, help="timed end-to-end calls per mode")
    p.add_argument("--modes", default=None, help=f"pipeline modes, comma list of {', '.join(PIPELINE_MODES)} "
                   "(default: all on cuda; eager on cpu or with --small)")


def require_device(name: str) -> torch.device:
    """The device to check; on a machine without a usable GPU a BackendError saying why."""
    if name == "cpu":
        return torch.device("cpu")
    if torch.version.cuda is None:
        raise BackendError(f"torch {torch.__version__} is a CPU build (no CUDA); install the CUDA torch wheel "
                           "(e.g. from .whl/) into this Python")
    if not torch.cuda.is_available():
        raise BackendError(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU "
                           "(torch.cuda.is_available() is False)")
    return torch.device("cuda")


class ReplayCounter:
    """How many CUDA graphs were replayed (torch.compile mode="reduce-overhead" replays its recorded
    graphs through torch.cuda.CUDAGraph.replay)."""

    def __init__(self) -> None:
        self.count = 0


@contextlib.contextmanager
def count_graph_replays() -> Iterator[ReplayCounter]:
    counter = ReplayCounter()
    original = torch.cuda.CUDAGraph.replay

    def replay(graph, *args, **kwargs):
        counter.count += 1
        return original(graph, *args, **kwargs)

    torch.cuda.CUDAGraph.replay = replay
    try:
        yield counter
    finally:
        torch.cuda.CUDAGraph.replay = original


@dataclasses.dataclass(frozen=True)
class BoxMatch:
    """Boxes of one frame on the checked device against the CPU reference."""

    reference: int
    checked: int
    matched: int  # same class, centre within CENTRE_TOL_M, score within SCORE_TOL
    max_centre_m: float
    max_score: float

    @property
    def ok(self) -> bool:
        return self.reference == self.checked == self.matched


def compare_detections(ref, got, centre_tol: float = CENTRE_TOL_M, score_tol: float = SCORE_TOL) -> BoxMatch:
    """Greedy one-to-one matching, best reference box first, to the nearest unused box of the same class."""
    used = np.zeros(len(got), dtype=bool)
    matched, max_centre, max_score = 0, 0.0, 0.0
    for i in np.argsort(-ref.scores, kind="stable"):
        candidates = np.flatnonzero((got.labels == ref.labels[i]) & ~used)
        if candidates.size == 0:
            continue
        dist = np.linalg.norm(got.boxes[candidates, :3] - ref.boxes[i, :3], axis=1)
        j = candidates[int(np.argmin(dist))]
        d, ds = float(dist.min()), abs(float(got.scores[j] - ref.scores[i]))
        if d <= centre_tol and ds <= score_tol:
            used[j] = True
            matched += 1
            max_centre, max_score = max(max_centre, d), max(max_score, ds)
    return BoxMatch(len(ref), len(got), matched, max_centre, max_score)


def simulated_frames(n: int, seed: int = 0) -> tuple[list[np.ndarray], float]:
    """Host point arrays (N, 4) float32 of a simulated Avia drive (no-returns dropped) and the true sensor height."""
    from livox_infer.sim.simulate import simulate_drive

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        frames = simulate_drive("avia", seed=seed, n_frames=n, speed_mps=8.0)
    points = [np.ascontiguousarray(f.points[np.any(f.points[:, :3] != 0, axis=1)], dtype=np.float32) for f in frames]
    return points, float(frames[0].sensor_height)


def build_pipeline(model: str, device: torch.device, mode: str, sensor_height: float, package: Path | None = None):
    from livox_infer.pipeline import DetectionPipeline

    # fixed mount: the ground estimate (host numpy) is not what this check measures; compiled modes time
    # torch.compile (never a package found in the cache), the package mode the package exported here
    return DetectionPipeline(model, device=str(device), compile=mode != "eager", cuda_graphs=mode == "cuda graphs",
                             sensor_height=sensor_height, sensor_tilt=None,
                             aoti_package=package if mode == "package" else False)


@contextlib.contextmanager
def exported_package(model: str, device: torch.device) -> Iterator[Path]:
    """An AOTInductor package of ``model`` for ``device``, exported into a private folder whose own manifest trusts it
    (the user's manifest and cache are left alone); removed afterwards."""
    from livox_infer.detector.aoti import MANIFEST_ENV
    from livox_infer.detector.config import ModelConfig
    from livox_infer.tools.export import export_package

    old = os.environ.get(MANIFEST_ENV)
    with tempfile.TemporaryDirectory(prefix="livox_device_package_") as folder:
        os.environ[MANIFEST_ENV] = str(Path(folder) / "aoti_manifest.json")
        try:
            cfg = ModelConfig.load(model)
            t0 = time.perf_counter()
            path = export_package(cfg, cfg.weights_path(), Path(folder) / f"{cfg.name}.{device.type}.pt2", str(device))
            print(f"  package exported for {device.type} in {time.perf_counter() - t0:.1f} s", flush=True)
            yield path
        finally:
            if old is None:
                os.environ.pop(MANIFEST_ENV, None)
            else:
                os.environ[MANIFEST_ENV] = old


@dataclasses.dataclass
class ModeResult:
    mode: str
    setup_s: float
    compiled: bool
    wall_ms: list[float]
    network_ms: list[float]
    replays: int
    matches: list[BoxMatch]


def run_mode(model: str, device: torch.device, mode: str, frames: list[np.ndarray], sensor_height: float,
             reference: list, iters: int) -> ModeResult:
    if mode == "package":
        with exported_package(model, device) as package:
            t0 = time.perf_counter()
            pipe = build_pipeline(model, device, mode, sensor_height, package)
            setup_s = time.perf_counter() - t0  # loading the package (the export is printed above)
        return _time_mode(pipe, mode, setup_s, frames, reference, iters, device)
    t0 = time.perf_counter()
    pipe = build_pipeline(model, device, mode, sensor_height)
    setup_s = time.perf_counter() - t0
    return _time_mode(pipe, mode, setup_s, frames, reference, iters, device)


def _time_mode(pipe, mode: str, setup_s: float, frames: list[np.ndarray], reference: list, iters: int,
               device: torch.device) -> ModeResult:
    matches = [compare_detections(ref, pipe.detect(pts)) for ref, pts in zip(reference, frames)]
    for pts in frames:  # warm-up beyond the checked pass
        pipe.detect(pts)
    wall, network = [], []
    with count_graph_replays() if device.type == "cuda" else contextlib.nullcontext(ReplayCounter()) as counter:
        for i in range(iters):
            t = time.perf_counter()
            det = pipe.detect(frames[i % len(frames)])  # host points in, boxes on the host out
            wall.append((time.perf_counter() - t) * 1e3)
            network.append(det.timings_ms["network"])
    return ModeResult(mode, setup_s, bool(pipe.compiled), wall, network, counter.count, matches)


def voxelize_table(device: torch.device, small: bool) -> None:
    from livox_infer.bench.voxelize import run_benchmark

    args = argparse.Namespace(sizes=SMALL_VOXELIZE_SIZES if small else VOXELIZE_SIZES, model=None,
                              repeat=20 if small else 200, warmup=2 if small else 10,
                              max_seconds=2.0 if small else 3.0, compile=not small, seed=0)
    run_benchmark(args, device)


def pipeline_report(results: list[ModeResult], iters: int, device: torch.device) -> bool:
    """Prints the box check, the CUDA-graph count and the end-to-end table; False if a check failed."""
    ok = True
    for r in results:
        bad = [m for m in r.matches if not m.ok]
        worst_c = max(m.max_centre_m for m in r.matches)
        worst_s = max(m.max_score for m in r.matches)
        boxes = sum(m.reference for m in r.matches)
        status = "ok  " if not bad and (r.compiled or r.mode == "eager") else "FAIL"
        ok &= status == "ok  "
        print(f"  {status} boxes {r.mode} on {device.type} vs cpu eager: {len(r.matches) - len(bad)}/{len(r.matches)} "
              f"frames equal ({boxes} boxes; max centre diff {worst_c * 100:.2f} cm, score diff {worst_s:.4f})"
              + ("" if r.compiled or r.mode == "eager" else "; compilation failed, ran eagerly"))
        if r.mode == "cuda graphs":
            engaged = r.replays >= iters
            ok &= engaged
            print(f"  {'ok  ' if engaged else 'FAIL'} CUDA graphs: {r.replays} graph replays in {iters} frames")
    eager = next((statistics.median(r.wall_ms) for r in results if r.mode == "eager"), None)
    rows = []
    for r in results:
        p50 = statistics.median(r.wall_ms)
        rows.append([r.mode + ("" if r.compiled or r.mode == "eager" else "*"), f"{p50:.3f}",
                     f"{np.percentile(r.wall_ms, 99):.3f}", f"{statistics.median(r.network_ms):.3f}",
                     str(r.replays) if device.type == "cuda" else "-",
                     f"{eager / p50:.2f}x" if eager else "-", f"{r.setup_s:.1f}"])
    print(f"end to end: host (N, 4) points -> boxes on the host, H2D copy included, {iters} calls per mode")
    print(format_table(["mode", "p50 ms", "p99 ms", "network p50 ms", "graph replays", "x eager", "setup s"], rows))
    return ok


def main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        device = require_device(args.device)
    except BackendError as exc:
        print(f"device_check: no usable GPU: {exc}", file=sys.stderr)
        return 2
    small = args.small or device.type == "cpu"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    print(f"device_check on {where}: torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.get_num_threads()} CPU threads{', small' if small else ''}")
    modes = [m.strip() for m in (args.modes or ("eager" if small else ",".join(PIPELINE_MODES))).split(",")]
    unknown = sorted(set(modes) - set(PIPELINE_MODES))
    if unknown:
        print(f"device_check: unknown modes {unknown}; use {', '.join(PIPELINE_MODES)}", file=sys.stderr)
        return 2

    def section(title: str) -> None:
        print(f"\n== {title} ({time.perf_counter() - started:.0f} s)", flush=True)

    from livox_infer.bench.voxelize import run_check

    try:
        section("voxelizer bit-exact vs the CPU reference")
        ok = run_check(device, small=small)
        section(f"pipeline boxes on {device.type} vs cpu eager" + (", CUDA graphs" if device.type == "cuda" else ""))
        frames, height = simulated_frames(args.frames)
        cpu = build_pipeline(args.model, torch.device("cpu"), "eager", height)
        reference = [cpu.detect(pts) for pts in frames]
        results = [run_mode(args.model, device, m, frames, height, reference, args.iters) for m in modes]
        ok &= pipeline_report(results, args.iters, device)
        section("voxelize per frame vs the torch.compile'd reference")
        voxelize_table(device, small)
    except LivoxInferError as exc:
        print(f"device_check: {exc}", file=sys.stderr)
        return 1
    section("done")
    print("DEVICE CHECK PASSED" if ok else "DEVICE CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m livox_infer.bench.device_check", description=__doc__.splitlines()[0])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
