"""``livox-infer bench decode``: PointCloud2 decoding speed, livox_infer vs sensor_msgs_py.

Decodes the same cloud (default: 24,000 Livox-like points, ~2 % no-returns, a few NaNs) in every
encode layout, as an rclpy ``sensor_msgs/msg/PointCloud2`` when sensor_msgs is importable (else a
PointCloud2Data), and prints median / p90 latency per method:

* ``sensor_msgs_py``: ``read_points_numpy(msg, ["x","y","z","intensity"], skip_nans=True)``
  (is_dense is set False so its NaN pass runs; it does not drop (0,0,0) points);
* ``livox_infer``: ``decode_pointcloud2(msg)`` (drops (0,0,0) and non-finite, also time/tag);
* ``livox_infer+filters``: plus strict tag filter, 0.5-200 m range and an ROI crop.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from livox_infer.pointcloud import LAYOUTS, DecodeFilter, decode_pointcloud2, encode_pointcloud2, to_ros_message

FILTERS = DecodeFilter(tag_filter="strict", min_range=0.5, max_range=200.0,
                       x_min=-100.0, x_max=100.0, y_min=-60.0, y_max=60.0, z_min=-5.0, z_max=5.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--points", type=int, default=24000, help="points per cloud (default 24000)")
    parser.add_argument("--repeat", type=int, default=200, help="timed decodes per row (default 200)")
    parser.add_argument("--pcd", type=Path, default=None,
                        help="take the points from this .pcd/.bin (tiled or cut to --points) instead of synthetic ones")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated encode layouts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rosbags-repeat", type=int, default=3,
                        help="timed rosbags CustomMsg deserializations (slow: one Python object per point; 0 skips)")


def make_points(n: int, seed: int = 0, source: Path | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(points (n,4), time (n,), tag (n,)): a Livox-like frame with ~2 % no-returns and 0.1 % NaN."""
    rng = np.random.default_rng(seed)
    if source is not None:
        from livox_infer.pointfiles import read_points_file

        base = read_points_file(source)
        pts = np.resize(base, (n, 4)).astype(np.float32)
    else:
        rng_r = rng.uniform(1.0, 120.0, n)
        az = rng.uniform(-0.6, 0.6, n)
        el = rng.uniform(-0.2, 0.2, n)
        pts = np.stack([rng_r * np.cos(el) * np.cos(az), rng_r * np.cos(el) * np.sin(az), rng_r * np.sin(el),
                        rng.integers(0, 256, n)], axis=1).astype(np.float32)
    pts[rng.random(n) < 0.02, :3] = 0.0
    pts[rng.random(n) < 0.001, 0] = np.nan
    tag = np.where(rng.random(n) < 0.05, 1, 0).astype(np.uint8) | (rng.integers(0, 2, n) << 4).astype(np.uint8)
    return pts, np.linspace(0.0, 0.1, n), tag


def _interleaved(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, tuple[float, float, Any]]:
    """Median and p90 ms per function, calling them round-robin so that a shared, noisy machine
    slows every method alike; the first call of each (warm-up) is not timed."""
    outputs = {name: fn() for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t0) * 1e3)
    result = {}
    for name, values in samples.items():
        values.sort()
        result[name] = (statistics.median(values), values[int(0.9 * (len(values) - 1))], outputs[name])
    return result


def main(args: argparse.Namespace) -> int:
    try:
        from sensor_msgs.msg import PointCloud2 as RosPointCloud2
    except ImportError:
        RosPointCloud2 = None
    try:
        from sensor_msgs_py.point_cloud2 import read_points_numpy
    except ImportError:
        read_points_numpy = None

    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    pts, t, tag = make_points(args.points, args.seed, args.pcd)
    print(f"cloud: {args.points} points ({'from ' + str(args.pcd) if args.pcd else 'synthetic Livox-like'}), "
          f"message: {'rclpy sensor_msgs/PointCloud2' if RosPointCloud2 else 'PointCloud2Data (sensor_msgs not installed)'}, "
          f"repeat {args.repeat}")
    print(f"sensor_msgs_py: {'installed' if read_points_numpy else 'not installed'}")
    header = f"{'layout':8} {'method':22} {'median ms':>10} {'p90 ms':>8} {'points':>7} {'vs sensor_msgs_py':>18}"
    print(header)
    print("-" * len(header))
    for layout in layouts:
        data = encode_pointcloud2(pts, layout, time=t, tag=tag, stamp_ns=1_700_000_000_000_000_000)
        data.is_dense = False
        msg = to_ros_message(data, RosPointCloud2) if RosPointCloud2 else data
        fns: dict[str, Callable[[], Any]] = {}
        if read_points_numpy is not None and RosPointCloud2 is not None:
            same_type = len({f.datatype for f in data.fields if f.name in ("x", "y", "z", "intensity")}) == 1
            if same_type:
                fns["sensor_msgs_py"] = lambda: read_points_numpy(
                    msg, field_names=["x", "y", "z", "intensity"], skip_nans=True)
            else:
                print(f"{layout:8} {'sensor_msgs_py':22} {'n/a (mixed field types)':>28}")
        fns["livox_infer"] = lambda: decode_pointcloud2(msg)
        fns["livox_infer+filters"] = lambda: decode_pointcloud2(msg, filters=FILTERS)
        rows = [(name, med, p90, len(out)) for name, (med, p90, out) in _interleaved(fns, args.repeat).items()]
        reference = rows[0][1] if rows[0][0] == "sensor_msgs_py" else None
        for name, med, p90, n in rows:
            speed = f"{reference / med:.2f}x" if reference else "-"
            print(f"{layout:8} {name:22} {med:10.3f} {p90:8.3f} {n:7d} {speed:>18}")
    _bench_custom_msg(pts, t, tag, args)
    return 0


def _bench_custom_msg(pts: np.ndarray, t: np.ndarray, tag: np.ndarray, args: argparse.Namespace) -> None:
    """Livox CustomMsg CDR -> Cloud: livox_infer's numpy codec vs rosbags' generic deserializer."""
    from livox_infer.bag import custom_msg_to_cloud, decode_custom_msg_cdr, encode_custom_msg_cdr, typestore

    raw = encode_custom_msg_cdr(pts, time=t, tag=tag, stamp_ns=1_700_000_000_000_000_000)
    fns: dict[str, Callable[[], Any]] = {"livox_infer": lambda: custom_msg_to_cloud(decode_custom_msg_cdr(raw)),
                                         "livox_infer+filters": lambda: custom_msg_to_cloud(
                                             decode_custom_msg_cdr(raw), FILTERS)}
    results = _interleaved(fns, args.repeat)
    if args.rosbags_repeat > 0:
        store = typestore()
        slow = _interleaved({"rosbags deserialize": lambda: store.deserialize_cdr(
            raw, "livox_ros_driver2/msg/CustomMsg")}, args.rosbags_repeat)
        med, p90, msg = slow["rosbags deserialize"]
        results = {"rosbags deserialize": (med, p90, msg.points), **results}
    reference = results.get("rosbags deserialize", (None,))[0]
    for name, (med, p90, out) in results.items():
        speed = f"{reference / med:.1f}x vs rosbags" if reference else "-"
        print(f"{'custom':8} {name:22} {med:10.3f} {p90:8.3f} {len(out):7d} {speed:>18}")
