"""Simulator speed table: CPU time per frame and per scene build, per sensor and scene mode.

    python -m livox_infer.sim.bench [--scenes 5] [--sensors avia horizon ...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def run(n_scenes: int, sensors: list[str], modes: list[str]) -> list[tuple[str, str, int, float, float]]:
    from livox_infer.sim import make_scene, simulate_frame

    rows = []
    for mode in modes:
        t0 = time.process_time()
        scenes = [make_scene(s, mode) for s in range(n_scenes)]
        scene_ms = (time.process_time() - t0) / n_scenes * 1000
        for sensor in sensors:
            simulate_frame(sensor, seed=0, scene=scenes[0])  # warm caches
            times = []
            for i, scn in enumerate(scenes):
                t0 = time.process_time()
                f = simulate_frame(sensor, seed=i, scene=scn)
                times.append(time.process_time() - t0)
            rows.append((mode, sensor, len(f.points), float(np.median(times)) * 1000, scene_ms))
    return rows


def main(argv: list[str] | None = None) -> int:
    from livox_infer.sim import SCENE_MODES, SENSORS

    ap = argparse.ArgumentParser(prog="python -m livox_infer.sim.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", type=int, default=5)
    ap.add_argument("--sensors", nargs="+", choices=sorted(SENSORS), default=sorted(SENSORS))
    ap.add_argument("--modes", nargs="+", choices=SCENE_MODES, default=list(SCENE_MODES))
    args = ap.parse_args(argv)
    if args.scenes < 1:
        ap.error("--scenes must be >= 1")
    print("CPU time (time.process_time), median over scenes")
    print(f"{'scene':8} {'sensor':8} {'points':>7} {'frame ms':>9} {'scene ms':>9}")
    for mode, sensor, n, frame_ms, scene_ms in run(args.scenes, args.sensors, args.modes):
        print(f"{mode:8} {sensor:8} {n:7d} {frame_ms:9.1f} {scene_ms:9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
