#!/usr/bin/env python3
"""Worst-case cloud cost: N points piled at one spot in front of the sensor (every point in the same
candidate box, so every stage gathers all of them), through the whole eager pipeline on 1 thread.

    PYTHONPATH=$PWD python scripts/worst_case_cloud.py --points 2000000 --iters 3

Prints one table row per frame size: wall time per frame (p50 / max over ``iters``) and per-stage
p50, the points that reached the voxelizer, and the peak resident memory of the process (MB).
Used for the point-budget numbers in docs/detector.md ("Point budget").
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import torch


def pile(n: int, seed: int = 0) -> np.ndarray:
    """n points within 0.5 m of (10, 0, -1.0) (a car-sized blob 10 m ahead), intensity 100."""
    rng = np.random.default_rng(seed)
    pts = np.empty((n, 4), np.float32)
    pts[:, 0] = 10.0 + rng.uniform(-0.5, 0.5, n)
    pts[:, 1] = rng.uniform(-0.5, 0.5, n)
    pts[:, 2] = -1.0 + rng.uniform(-0.5, 0.5, n)
    pts[:, 3] = 100.0
    return pts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, nargs="+", default=[2_000_000])
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--max-points", type=int, default=None, help="pipeline point budget (default: the pipeline's)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from livox_infer.pipeline import DetectionPipeline

    kw = {} if args.max_points is None else {"max_points": args.max_points}
    pipe = DetectionPipeline("lite", device="cpu", compile=False, sensor_height=1.8, sensor_tilt=None, **kw)
    budget = pipe.params.get("max_points", "none")
    print(f"max_points {budget}, torch {torch.__version__}, 1 thread, eager")
    print(f"{'points':>9} | {'p50 ms':>8} | {'max ms':>8} | {'voxelize':>8} | {'refine':>8} | {'kept':>9} | {'peak RSS MB':>11}")
    for n in args.points:
        cloud = pile(n)
        wall, stages = [], []
        for _ in range(args.iters):
            t = time.perf_counter()
            det = pipe.detect(cloud)
            wall.append((time.perf_counter() - t) * 1e3)
            stages.append(det.timings_ms)
        med = lambda k: float(np.median([s[k] for s in stages]))  # noqa: E731
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{n:>9} | {np.median(wall):>8.0f} | {max(wall):>8.0f} | {med('voxelize'):>8.1f} | {med('refine'):>8.1f} "
              f"| {det.num_points:>9} | {rss:>11.0f}")


if __name__ == "__main__":
    main()
