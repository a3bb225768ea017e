"""``livox-infer bench decode``: PointCloud2 decoding speed, livox_infer vs sensor_msgs_py.

Decodes the same cloud (default: 24,000 Livox-like points, ~2 % no-returns, a few NaNs) in every
encode layout, as an rclpy ``sensor_msgs/msg/PointCloud2`` when sensor_msgs is importable (else a
PointCloud2Data), and prints median / p90 latency per method (sensor_msgs_py only when it is importable; otherwise
the comparison is skipped with a note):

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

from livox_infer.bench.table import format_table
from livox_infer.decode.pointcloud import LAYOUTS, DecodeFilter, decode_pointcloud2, encode_pointcloud2, to_ros_message

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
        from livox_infer.decode.pointfiles import read_points_file

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
        result[name] = (statistics.median(values), float(np.percentile(values, 90)), outputs[name])
    return result


HEADER = ["layout", "method", "median ms", "p90 ms", "points", "x sensor_msgs_py time"]
TARGET_RATIO = 1.0  # our decode with every filter in at most sensor_msgs_py's time


def _sensor_msgs_py_reader() -> tuple[Callable | None, str]:
    """``read_points_numpy`` and its version, or None and why the comparison is skipped."""
    try:
        from sensor_msgs_py.point_cloud2 import read_points_numpy
    except ImportError as exc:
        return None, (f"sensor_msgs_py not importable ({exc}): comparison skipped; for it, install sensor_msgs_py "
                      "(a ROS 2 install, or pip install --target DIR ../shared/ros2_upstream/common_interfaces"
                      "/sensor_msgs_py after unpacking, with DIR on PYTHONPATH)")
    try:
        from importlib.metadata import version

        ver = version("sensor_msgs_py")
    except Exception:  # noqa: BLE001 - a ROS install carries no pip metadata
        ver = "version unknown"
    return read_points_numpy, f"sensor_msgs_py {ver}: read_points_numpy(skip_nans=True) in the same run"


def main(args: argparse.Namespace) -> int:
    try:
        from sensor_msgs.msg import PointCloud2 as RosPointCloud2
    except ImportError:
        RosPointCloud2 = None
    read_points_numpy, note = _sensor_msgs_py_reader()
    if RosPointCloud2 is None and read_points_numpy is not None:
        read_points_numpy, note = None, "sensor_msgs (rclpy messages) not importable: sensor_msgs_py comparison skipped"

    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    pts, t, tag = make_points(args.points, args.seed, args.pcd)
    print(f"cloud: {args.points} points ({'from ' + str(args.pcd) if args.pcd else 'synthetic Livox-like'}), "
          f"message: {'rclpy sensor_msgs/PointCloud2' if RosPointCloud2 else 'PointCloud2Data (sensor_msgs not installed)'}, "
          f"repeat {args.repeat}")
    print(note)
    rows, ratios = [], {}
    for layout in layouts:
        data = encode_pointcloud2(pts, layout, time=t, tag=tag, stamp_ns=1_700_000_000_000_000_000)
        data.is_dense = False
        msg = to_ros_message(data, RosPointCloud2) if RosPointCloud2 else data
        fns: dict[str, Callable[[], Any]] = {}
        if read_points_numpy is not None:
            same_type = len({f.datatype for f in data.fields if f.name in ("x", "y", "z", "intensity")}) == 1
            if same_type:
                fns["sensor_msgs_py"] = lambda: read_points_numpy(
                    msg, field_names=["x", "y", "z", "intensity"], skip_nans=True)
            else:
                rows.append([layout, "sensor_msgs_py", "n/a", "n/a", "-", "n/a"])  # it needs one field type
        fns["livox_infer"] = lambda: decode_pointcloud2(msg)
        fns["livox_infer+filters"] = lambda: decode_pointcloud2(msg, filters=FILTERS)
        results = _interleaved(fns, args.repeat)
        reference = results["sensor_msgs_py"][0] if "sensor_msgs_py" in results else None
        for name, (med, p90, out) in results.items():
            rows.append([layout, name, f"{med:.3f}", f"{p90:.3f}", len(out),
                         f"{med / reference:.2f}x" if reference else "-"])
        if reference:
            ratios[layout] = results["livox_infer+filters"][0] / reference
    rows += _bench_custom_msg(pts, t, tag, args)
    print(format_table(HEADER, rows))
    if any(r[2] == "n/a" for r in rows):
        print("n/a: read_points_numpy needs x, y, z and intensity of one type (xyzirc mixes float32 and uint8)")
    if ratios:
        met = all(r <= TARGET_RATIO for r in ratios.values())
        print(f"target livox_infer+filters <= {TARGET_RATIO:.1f}x sensor_msgs_py's time (while also dropping no-returns "
              f"and applying tag / range / ROI filters): {'met' if met else 'NOT met'} "
              f"({', '.join(f'{k} {v:.2f}x' for k, v in ratios.items())})")
    return 0


def _bench_custom_msg(pts: np.ndarray, t: np.ndarray, tag: np.ndarray, args: argparse.Namespace) -> list[list]:
    """Table rows: Livox CustomMsg CDR -> Cloud, livox_infer's numpy codec vs rosbags' generic deserializer."""
    from livox_infer.decode.custom_msg import custom_msg_to_cloud, decode_custom_msg_cdr, encode_custom_msg_cdr
    from livox_infer.bags import typestore

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
    return [["custom", name, f"{med:.3f}", f"{p90:.3f}", len(out),
             f"{med / reference:.4f}x rosbags" if reference else "-"] for name, (med, p90, out) in results.items()]
