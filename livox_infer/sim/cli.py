"""``livox-infer simulate`` / `simulate(SimulateOptions(...))`: write simulated Livox frames and their ground truth into a rosbag2.

Clouds go to /livox/lidar (PointCloud2 in the chosen layout, or livox_ros_driver2/msg/CustomMsg with
``--layout custom``), ground truth to /livox_infer/ground_truth as vision_msgs/Detection3DArray with the
same stamp and frame_id (Detection3D.id = the object's id, stable over the drive), the same objects with their
velocities to /livox_infer/ground_truth_tracks as livox_infer_msgs/TrackedObjects (velocity over ground,
twist in the object's frame), and the sensor's pose to /livox_infer/odometry (nav_msgs/Odometry, odom -> frame_id).
Frames are one continuous drive (the scan pattern continues across frames).
"""

from __future__ import annotations

import argparse
import sys
import time as _time
from dataclasses import dataclass, fields

from livox_infer.errors import LivoxInferError
from livox_infer.sim.scene import SCENE_MODES
from livox_infer.sim.sensors import SENSORS

LAYOUTS = ("livox", "livox2", "xyzi", "xyzirc", "custom")
DEFAULT_START_NS = 1_700_000_000 * 1_000_000_000  # fixed start stamp: reproducible bags


@dataclass
class SimulateOptions:
    """What `simulate` writes: one continuous drive of ``frames`` frames into the bag directory ``out``."""

    out: str
    sensor: str = "avia"
    frames: int = 20
    seed: int = 0
    storage: str = "sqlite3"
    layout: str = "livox"  # PointCloud2 field layout, or "custom" for livox_ros_driver2/msg/CustomMsg
    scene: str = "street"
    speed: float = 8.0  # ego speed along the road, m/s
    period: float = 0.1  # frame period, s
    frame_id: str = "livox_frame"
    topic: str = "/livox/lidar"
    gt_topic: str = "/livox_infer/ground_truth"
    gt_tracks_topic: str = "/livox_infer/ground_truth_tracks"
    odometry_topic: str = "/livox_infer/odometry"
    min_points: int = 5  # ground truth only for objects with at least this many returns
    drop_zeros: bool = False  # drop (0,0,0) no-return points (the Livox driver keeps them)
    sensor_height: float | None = None  # m above ground (None: random 0.5-2.5)
    n_cars: int | None = None
    n_pedestrians: int | None = None
    n_cyclists: int | None = None
    clutter: float | None = None  # background density multiplier (None: 1)
    yaw_rate: float = 0.0  # ego turn rate, deg/s (the road stays straight)
    deskew: bool = False  # motion-compensate each frame into the sensor frame at its start (as SLAM outputs)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SimulateOptions":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


_D = SimulateOptions(out="")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sensor", choices=sorted(SENSORS), default=_D.sensor)
    p.add_argument("--frames", type=int, default=_D.frames, help="number of frames (10 Hz by default)")
    p.add_argument("--seed", type=int, default=_D.seed)
    p.add_argument("--out", required=True, help="output bag directory (must not exist)")
    p.add_argument("--storage", choices=("sqlite3", "mcap"), default=_D.storage)
    p.add_argument("--layout", choices=LAYOUTS, default=_D.layout,
                   help="PointCloud2 field layout, or 'custom' for livox_ros_driver2/msg/CustomMsg")
    p.add_argument("--scene", choices=SCENE_MODES, default=_D.scene)
    p.add_argument("--speed", type=float, default=_D.speed, help="ego speed along the road, m/s")
    p.add_argument("--period", type=float, default=_D.period, help="frame period, s")
    p.add_argument("--frame-id", default=_D.frame_id)
    p.add_argument("--topic", default=_D.topic)
    p.add_argument("--gt-topic", default=_D.gt_topic)
    p.add_argument("--gt-tracks-topic", default=_D.gt_tracks_topic,
                   help="ground-truth ids and velocities (livox_infer_msgs/TrackedObjects)")
    p.add_argument("--odometry-topic", default=_D.odometry_topic, help="sensor pose (nav_msgs/Odometry, odom -> frame id)")
    p.add_argument("--min-points", type=int, default=_D.min_points,
                   help="write ground-truth boxes only for objects with at least this many returns")
    p.add_argument("--drop-zeros", action="store_true",
                   help="drop (0,0,0) no-return points (the Livox driver keeps them)")
    p.add_argument("--sensor-height", type=float, default=_D.sensor_height,
                   help="m above ground (default: random 0.5-2.5)")
    p.add_argument("--n-cars", type=int, default=_D.n_cars)
    p.add_argument("--n-pedestrians", type=int, default=_D.n_pedestrians)
    p.add_argument("--n-cyclists", type=int, default=_D.n_cyclists)
    p.add_argument("--clutter", type=float, default=_D.clutter, help="background density multiplier (default 1)")
    p.add_argument("--yaw-rate", type=float, default=_D.yaw_rate, help="ego turn rate, deg/s (the road stays straight)")
    p.add_argument("--deskew", action="store_true",
                   help="motion-compensate each frame into the sensor frame at its start (as SLAM outputs)")


def simulate(args: SimulateOptions) -> dict:
    """Write the drive ``args`` describes; returns frame, box and point counts."""
    from livox_infer.bags import BagWriter
    from livox_infer.decode.pointcloud import encode_pointcloud2
    from livox_infer.sim.simulate import iter_drive

    if args.frames < 1:
        raise LivoxInferError("--frames must be >= 1")
    scene_opts = {k: v for k, v in (("n_cars", args.n_cars), ("n_pedestrians", args.n_pedestrians),
                                     ("n_cyclists", args.n_cyclists), ("clutter", args.clutter)) if v is not None}
    frame_opts = {"period": args.period, "yaw_rate_dps": args.yaw_rate, "deskew": args.deskew}
    if args.sensor_height is not None:
        frame_opts["sensor_height"] = args.sensor_height
    # validate everything before the bag directory is created; frames are simulated as they are written
    frames = iter_drive(args.sensor, args.seed, args.frames, speed_mps=args.speed, scene=args.scene,
                        **scene_opts, **frame_opts)
    period_ns = int(round(args.period * 1e9))
    n_boxes = 0
    n_points = 0
    with BagWriter(args.out, storage=args.storage) as bag:
        for k, f in enumerate(frames):
            stamp = DEFAULT_START_NS + k * period_ns
            pts, t, tag, line = f.points, f.time, f.tag, f.line
            if args.drop_zeros:
                v = f.valid
                pts, t, tag, line = pts[v], t[v], tag[v], line[v]
            if args.layout == "custom":
                bag.write_custom_msg(args.topic, pts, time=t, tag=tag, line=line, stamp_ns=stamp,
                                     frame_id=args.frame_id, timebase=stamp)
            else:
                msg = encode_pointcloud2(pts, args.layout, time=t, tag=tag, line=line, stamp_ns=stamp,
                                         frame_id=args.frame_id)
                bag.write_cloud(args.topic, msg)
            keep = f.num_points >= args.min_points
            bag.write_detections(args.gt_topic, stamp, args.frame_id, f.boxes[keep], f.labels[keep],
                                 ids=f.object_ids[keep])
            bag.write_tracked_objects(args.gt_tracks_topic, stamp, args.frame_id, f.boxes[keep], f.labels[keep],
                                      f.object_ids[keep], f.velocities[keep])
            bag.write_odometry(args.odometry_topic, stamp, "odom", args.frame_id, f.pose)
            n_boxes += int(keep.sum())
            n_points += len(pts)
    return {"frames": args.frames, "boxes": n_boxes, "points": n_points}


def main(args: argparse.Namespace) -> int:
    t0 = _time.perf_counter()
    try:
        info = simulate(SimulateOptions.from_args(args))
    except LivoxInferError as e:
        print(f"livox-infer simulate: {e}", file=sys.stderr)
        return 2
    dt = _time.perf_counter() - t0
    print(f"wrote {args.out}: {info['frames']} frames of {args.sensor} ({args.scene}), {info['points']} points, "
          f"{info['boxes']} ground-truth boxes on {args.gt_topic} ({dt:.1f} s)")
    return 0
