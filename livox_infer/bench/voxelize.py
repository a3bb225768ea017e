"""``livox-infer bench voxelize``: the voxelizer against the plain-torch reference, eager and compiled.

For 10k / 24k / 100k / 1M Livox-like points on whatever device is there, prints median latency of

* ``voxelizer``: on GPU the fused Triton kernels replayed from a CUDA graph (points copied into a
  static buffer, N written on the device, two kernels), plus the plain op call (``Voxelizer``
  forward, two launches from Python) as ``op``; on CPU the ``Voxelizer`` module (plain-torch sparse
  path with its accumulators kept across frames);
* ``eager ref``: ``voxelize_reference`` (stateless, allocates per call);
* ``compiled ref``: ``torch.compile`` of the dense reference (kernel 1 + kernel 2 mirrored with
  scatter ops; no data-dependent shapes);

and the speed-ups of the voxelizer over both. GPU times come from CUDA events around each call
(latency, including launch gaps), CPU times from perf_counter; methods are called round-robin so a
shared machine slows all of them alike; warm-up calls are not timed.

``python -m livox_infer.bench.voxelize --check`` first checks on the GPU that the Triton path
(op, CUDA graph, torch.compile(fullgraph=True)) equals the CPU reference bit for bit on a set of
awkward clouds, then runs the benchmark; exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from livox_infer.bench.table import format_table
from livox_infer.params import add_cli_options
from livox_infer.threads import add_threads_argument, apply_threads
from livox_infer.voxelize import GridConfig, Voxelizer, voxelize_reference
from livox_infer.voxelize.reference import ReferenceConstants, voxelize_reference_dense

DEFAULT_SIZES = "10000,24000,100000,1000000"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated point counts (default {DEFAULT_SIZES})")
    parser.add_argument("--model", default=None,
                        help="model config whose grid to use (default: 'full' on GPU, 'lite' on CPU)")
    add_cli_options(parser, ("device",))
    parser.add_argument("--repeat", type=int, default=200, help="timed calls per method and size (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls first (default 10)")
    parser.add_argument("--max-seconds", type=float, default=20.0,
                        help="cap on timed seconds per method and size; fewer repeats for big clouds (default 20)")
    add_cli_options(parser, ("compile",), helps={"compile": "also time the torch.compile'd reference (default %(default)s)"})
    add_threads_argument(parser)
    parser.add_argument("--check", action="store_true",
                        help="first check the GPU path against the CPU reference bit for bit (exit 1 on mismatch)")
    parser.add_argument("--seed", type=int, default=0)


def livox_like_points(n: int, grid: GridConfig, seed: int = 0) -> torch.Tensor:
    """A forward-looking Livox-like frame: density falling with range, ~60 % ground returns near
    z = 0, objects up to 3 m, ~5 % of the points outside the grid; intensity 0-255."""
    rng = np.random.default_rng(seed)
    x_extent = grid.x_range[1] - grid.x_range[0]
    r = np.exp(rng.uniform(np.log(1.0), np.log(1.1 * max(x_extent, 1.0)), n))
    az = rng.uniform(-0.6, 0.6, n)
    ground = rng.random(n) < 0.6
    z = np.where(ground, rng.normal(0.0, 0.03, n), rng.uniform(0.0, 3.0, n))
    pts = np.stack([grid.x_range[0] + r * np.cos(az), r * np.sin(az), z, rng.integers(0, 256, n)], axis=1)
    return torch.from_numpy(pts.astype(np.float32))


def _grid_for(model: str | None, device: torch.device) -> tuple[str, GridConfig]:
    from livox_infer.detector.config import ModelConfig

    name = model or ("full" if device.type == "cuda" else "lite")
    return name, ModelConfig.load(name).grid


# -- timing -----------------------------------------------------------------------------------------

def _time_round_robin(fns: dict[str, Callable[[], object]], repeat: int, warmup: int, max_seconds: float,
                      cuda: bool) -> dict[str, tuple[float, float | None]]:
    """Median milliseconds per call of each function: (wall or CUDA-event latency, process CPU time;
    None on GPU). On a CPU shared with other jobs the CPU time is the steadier figure: wall time
    also counts the waits for a free core."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if cuda:
        torch.cuda.synchronize()
    # Repeats capped by time: estimate from one call of each method.
    t0 = time.perf_counter()
    for fn in fns.values():
        fn()
    if cuda:
        torch.cuda.synchronize()
    per_round = max(time.perf_counter() - t0, 1e-6)
    repeat = max(3, min(repeat, int(max_seconds / per_round)))
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                wall[name].append(start.elapsed_time(end))
            else:
                c, t = time.process_time(), time.perf_counter()
                fn()
                wall[name].append((time.perf_counter() - t) * 1e3)
                cpu[name].append((time.process_time() - c) * 1e3)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k]) if cpu[k] else None) for k in fns}


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if ms < 1.0 else f"{ms:.3f} ms"


def run_benchmark(args: argparse.Namespace, device: torch.device) -> list[dict[str, tuple[float, float | None]]]:
    """Prints the table; returns per size {method: (wall or CUDA-event ms, CPU ms or None)} plus "points"."""
    cuda = device.type == "cuda"
    model, grid = _grid_for(args.model, device)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    constants = ReferenceConstants(grid, device)
    voxelizer = Voxelizer(grid, device)
    graph_voxelizer = voxelizer.cuda_graph(max(sizes)) if cuda else None
    compiled_ref = None
    if args.compile:
        compiled_ref = torch.compile(lambda p: voxelize_reference_dense(p, grid, constants), dynamic=True)

    name = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} torch threads"
    print(f"voxelize benchmark on {name}; grid '{model}' {grid.shape} (C, H, W); "
          f"torch {torch.__version__}; median of up to {args.repeat} calls")
    if cuda:
        print("times: CUDA-event latency per call; voxelizer = CUDA-graph replay incl. the points copy, "
              "op = custom-op call (two launches from Python)")
        header = ["points", "voxelizer", "op", "eager ref", "compiled ref", "x eager", "x compiled"]
    else:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"times: wall / process CPU time per call, speed-ups from CPU time; load average {load:.1f} "
              f"on {os.cpu_count()} cores")
        header = ["points", "voxelizer", "(cpu)", "eager ref", "(cpu)", "compiled ref", "(cpu)", "x eager", "x compiled"]
    rows, results = [], []
    for n in sizes:
        points = livox_like_points(n, grid, args.seed).to(device)
        fns: dict[str, Callable[[], object]] = {}
        fns["voxelizer"] = (lambda: graph_voxelizer(points)) if cuda else (lambda: voxelizer(points))
        if cuda:
            fns["op"] = lambda: voxelizer(points)
        fns["eager"] = lambda: voxelize_reference(points, grid, constants)
        if compiled_ref is not None:
            t = time.perf_counter()
            compiled_ref(points)  # compile (first size) outside the timing
            if time.perf_counter() - t > 1.0:
                print(f"  (torch.compile of the reference took {time.perf_counter() - t:.1f} s)")
            fns["compiled"] = lambda: compiled_ref(points)
        ms = _time_round_robin(fns, args.repeat, args.warmup, args.max_seconds, cuda)
        results.append({"points": n, **ms})
        key = 0 if cuda else 1  # speed-ups from latency on GPU, from CPU time on CPU
        v = ms["voxelizer"][key]
        row = [f"{n:,}"]
        for name in (["voxelizer", "op", "eager", "compiled"] if cuda else ["voxelizer", "eager", "compiled"]):
            wall_ms, cpu_ms = ms.get(name, (None, None))
            row.append(_fmt_ms(wall_ms))
            if not cuda:
                row.append(_fmt_ms(cpu_ms))
        for name in ("eager", "compiled"):
            row.append(f"{ms[name][key] / v:.1f}x" if name in ms else "-")
        rows.append(row)
    print(format_table(header, rows))
    sys.stdout.flush()
    return results


# -- GPU bit-equality check ----------------------------------------------------------------------

def _check_clouds(grid: GridConfig) -> dict[str, torch.Tensor]:
    (x0, x1), (y0, y1), (z0, z1) = grid.x_range, grid.y_range, grid.z_range
    gen = torch.Generator().manual_seed(1)
    clouds = {
        "livox_24k": livox_like_points(24000, grid, 1),
        "livox_1M": livox_like_points(1_000_000, grid, 2),
        "empty": torch.zeros((0, 4)),
        "out_of_range": livox_like_points(5000, grid, 3) + torch.tensor([1e4, 0.0, 0.0, 0.0]),
    }
    centres = livox_like_points(40, grid, 4).repeat_interleave(500, 0)
    centres[:, :3] += (torch.rand(centres.shape[0], 3, generator=gen) - 0.5) * torch.tensor([0.05, 0.05, 2.0])
    clouds["clustered"] = centres
    below = lambda v: float(np.nextafter(np.float32(v), np.float32(-np.inf)))  # noqa: E731
    xs, ys, zs = [x0, below(x0), x1, below(x1)], [y0, below(y0), y1, below(y1)], [z0, below(z0), z1, below(z1), 0.0]
    clouds["edges"] = torch.tensor([[x, y, z, i] for x in xs for y in ys for z in zs for i in (-1.0, 0.0, 255.0, 1e9)])
    special = torch.tensor([1e30, -1e30, math.inf, -math.inf, math.nan, 3e38])
    ext = livox_like_points(6 * 4 * 10, grid, 5)
    for k in range(ext.shape[0]):
        ext[k, k % 4] = special[(k // 4) % 6]
    clouds["extreme"] = ext
    try:
        from livox_infer.decode.pointfiles import read_pcd
        from livox_infer.resources import share_dir

        pcd = share_dir().parent / "shared" / "data" / "livox_horizon" / "livox_source.pcd"
        if pcd.is_file():
            real = torch.from_numpy(np.ascontiguousarray(read_pcd(pcd), dtype=np.float32))
            real[:, 2] += 0.9
            clouds["horizon_scan"] = real
    except Exception:  # noqa: BLE001 - the real scan is optional for the check
        pass
    return clouds


def run_check(device: torch.device, small: bool = False) -> bool:
    """The voxelizer on `device` == CPU reference, bit for bit, for several grids and clouds: on a GPU the
    Triton op, its CUDA graph and torch.compile of it (fullgraph, reduce-overhead). ``small``: no 1M-point
    cloud and no compile (a quick run; on CPU the module's own path, the Triton kernels under TRITON_INTERPRET=1)."""
    ok = True
    cuda = device.type == "cuda"

    def report(label: str, got: torch.Tensor | Exception, ref: torch.Tensor) -> None:
        nonlocal ok
        if isinstance(got, Exception):
            ok = False
            print(f"  FAIL {label}: {type(got).__name__}: {str(got).splitlines()[0] if str(got) else ''}")
            return
        got = got.cpu()
        if got.shape == ref.shape and torch.equal(got, ref):
            print(f"  ok   {label}")
        else:
            ok = False
            diff = (got - ref).abs() if got.shape == ref.shape else None
            detail = "shape " + str(tuple(got.shape)) if diff is None else \
                f"{int((diff > 0).sum())} values differ, max |diff| {float(diff.nan_to_num(1e9).max()):.3g}"
            print(f"  FAIL {label}: {detail}")

    def attempt(fn: Callable[[], torch.Tensor]) -> torch.Tensor | Exception:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - reported as a failed check
            return exc

    from livox_infer.detector.config import ModelConfig

    backend = "triton" if cuda or os.environ.get("TRITON_INTERPRET") == "1" else "torch"
    for model in ("lite", "full"):
        grid = ModelConfig.load(model).grid
        where = torch.cuda.get_device_name(device) if cuda else "CPU"
        print(f"check grid '{model}' {grid.shape} on {where}, {backend} voxelizer vs the CPU reference")
        op = Voxelizer(grid, device, backend=backend)
        variants: dict[str, object] = {"op": op}
        if cuda:
            variants["cuda graph"] = op.cuda_graph(1_000_000)
        if not small:
            variants["compile fullgraph"] = attempt(lambda: torch.compile(Voxelizer(grid, device), fullgraph=True))
            if cuda:
                variants["compile reduce-overhead"] = attempt(
                    lambda: torch.compile(Voxelizer(grid, device), fullgraph=True, mode="reduce-overhead"))
        for name, cloud in _check_clouds(grid).items():
            if small and cloud.shape[0] > 100_000:
                continue
            ref = voxelize_reference(cloud, grid)
            pts = cloud.to(device)
            for label, fn in variants.items():
                # clone: a CUDA graph / reduce-overhead output is overwritten by the next replay
                report(f"{name:13s} {label}", fn if isinstance(fn, Exception) else attempt(lambda: fn(pts).clone()), ref)
            shuffled = pts[torch.randperm(pts.shape[0], device=device)]
            report(f"{name:13s} op, shuffled", attempt(lambda: op(shuffled)), ref)
        if cuda:
            torch.cuda.synchronize()
    print("CHECK PASSED" if ok else "CHECK FAILED")
    return ok


def main(args: argparse.Namespace) -> int:
    apply_threads(args.threads)  # again for `python -m livox_infer.bench.voxelize` (no cli.main)
    from livox_infer.voxelize.voxelizer import resolve_device

    device = resolve_device(args.device)
    ok = True
    if args.check:
        if device.type == "cuda":
            ok = run_check(device)
        else:
            print("--check: no GPU here, so there is no Triton path to check (the CPU tests run the kernels "
                  "in the Triton interpreter); running the CPU benchmark only")
    run_benchmark(args, device)
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m livox_infer.bench.voxelize", description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
