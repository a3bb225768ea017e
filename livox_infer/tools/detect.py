"""`livox-infer detect INPUT --out detections.jsonl`: run the detector over a bag or point files, no ROS.

INPUT: a rosbag2 (directory, .db3 or .mcap; PointCloud2 in any layout or Livox CustomMsg), one or
more .pcd/.bin files, or a directory of them. One JSON line per frame:
``{"stamp": ns, "frame_id": str, "source": str, "latency_ms": float, "timings_ms": {...},
"sensor_height": m, "boxes": [{"label", "score", "x", "y", "z", "l", "w", "h", "yaw"}, ...]}``; from a bag,
tracked (``--no-tracking`` to skip, docs/tracking.md), each box adds ``"track_id"`` (0 until its track is confirmed)
and, with a confirmed track, ``"vx", "vy"`` (m/s in the cloud frame's axes: over ground with ``--odometry-topic``,
else relative to the sensor) and ``"yaw_rate"`` (rad/s).
Optional: ``--bev-dir`` writes a bird's-eye PNG per frame, ``--out-bag`` a rosbag2 with the clouds
and the detections (vision_msgs/Detection3DArray on /livox_infer/detections) for RViz / Foxglove.
``--out-dir DIR`` instead of ``--out`` runs over an archive (one output per recording, a resumable
manifest, optionally on Ray): see livox_infer/tools/fleet.py and docs/fleet.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from livox_infer.errors import ConfigError, LivoxInferError, PointCloudError
from livox_infer.ground import mount_message, mount_mismatch
from livox_infer.params import BY_NAME, DEFAULTS, add_cli_options
from livox_infer.tools.bev_plot import save_bev_png
from livox_infer.tools.detect_io import build_pipeline, detection_row, is_bag, iter_frames, track_frame, write_annotated


def out_bag_storage(path: str, storage: str | None) -> str:
    """The storage of the --out-bag directory: as asked, else from the name (``x.mcap`` -> mcap); a name that
    says one storage while --out-bag-storage asks for the other is refused (the bag would mislead its reader)."""
    suffix = Path(path).suffix
    named = {".mcap": "mcap", ".db3": "sqlite3"}.get(suffix)
    if storage and named and storage != named:
        raise ConfigError(f"--out-bag {path} names a {named} bag but --out-bag-storage is {storage}")
    return storage or named or "sqlite3"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", nargs="*", help="rosbag2 (dir/.db3/.mcap), .pcd/.bin/.npy files, or a directory of them; "
                   "with --out-dir: directories are searched recursively and @FILE names a list of inputs")
    p.add_argument("--out", help="detections JSONL file ('-' for stdout); or --out-dir")
    p.add_argument("--topic", default=None, help="cloud topic in the bag (default: every cloud topic)")
    # None = not given: the --sensor preset's value (or the pipeline's default) applies
    add_cli_options(p, ("model", "weights", "device", "compile", "precision", "sensor_height", "threads"), sensor_height=None,
                    helps={"sensor_height": "metres from the sensor down to the ground, or 'auto': estimated per "
                           "cloud (default: the --sensor preset's, else auto)"})
    p.add_argument("--aoti-package", default=None, help="AOTInductor package from `livox-infer export` (instead of compiling)")
    p.add_argument("--test-time-flip", action="store_true", default=None,
                   help="average the frame and its mirror image (~2x network time)")
    p.add_argument("--no-refine", action="store_true", default=None,
                   help="stage 1 alone: skip the stage-2 refiner of models with a refine section")
    p.add_argument("--sensor-tilt", type=float, nargs=2, metavar=("PITCH_DEG", "ROLL_DEG"), default=None,
                   help="known mounting tilt (default: estimated from each cloud)")
    p.add_argument("--intensity-scale", type=float, default=None, help="full-scale intensity (255 Livox, 1 for 0-1)")
    p.add_argument("--score-threshold", type=float, default=None, help="one score threshold for every class")
    p.add_argument("--tag-filter", default=None, choices=("off", "high_confidence", "strict"),
                   help="Livox tag noise filter (default: the --sensor preset's, else high_confidence)")
    p.add_argument("--tracking", action=argparse.BooleanOptionalAction, default=DEFAULTS["tracking"],
                   help="track the boxes of a bag's frames: track_id, vx, vy, yaw_rate per box in the JSONL "
                        "(docs/tracking.md; point files carry no time: not tracked) (default %(default)s)")
    p.add_argument("--track-motion", action=argparse.BooleanOptionalAction,
                   default=DEFAULTS["accumulate_track_motion"],
                   help="with --accumulate-frames > 1 and tracking: " + BY_NAME["accumulate_track_motion"].doc.split(
                       ": ", 1)[-1] + " (default %(default)s)")
    p.add_argument("--odometry-topic", default=None,
                   help="nav_msgs/Odometry topic of the bag (e.g. /livox_infer/odometry, as `livox-infer simulate` "
                        "writes it): tracked velocities over ground instead of relative to the sensor, and with "
                        "--accumulate-frames the stack motion-compensated with it, as the node does")
    p.add_argument("--max-frames", type=int, default=None)
    p.add_argument("--bev-dir", default=None, help="write a bird's-eye PNG per frame here")
    p.add_argument("--out-bag", default=None, help="write clouds + Detection3DArray into this new rosbag2")
    p.add_argument("--out-bag-storage", default=None, choices=("sqlite3", "mcap"),
                   help="default: mcap when --out-bag ends in .mcap, else sqlite3")
    from livox_infer.tools.fleet import add_arguments as add_fleet_arguments

    add_fleet_arguments(p)
    add_rig_arguments(p)


def add_rig_arguments(p: argparse.ArgumentParser) -> None:
    add_cli_options(p, ("sensor",), sensor=None, helps={"sensor": "apply the preset config/<sensor>.param.yaml as the "
                    "node does (ROI, range, tag filter, sensor height, grid); options given on the command line win "
                    "over the preset's"})
    p.add_argument("--rig", default=None, help="rig YAML (docs/rigs.md): INPUT is a directory with one sub-folder "
                   "per rig sensor; their clouds are merged into the rig's output frame and detected once")
    p.add_argument("--accumulate-frames", type=int, default=1, help="detect on the last N frames stacked")
    p.add_argument("--accumulate-ms", type=float, default=0.0, help="... only frames within T ms of the newest")


def _check_paths(args: argparse.Namespace) -> None:
    """Every input exists and every output's folder does (PointCloudError / ConfigError, one line)."""
    from livox_infer.tools.detect_io import is_bag

    for name in args.input:
        if not Path(name).exists():
            raise PointCloudError(f"input not found: {name}")
        if is_bag(Path(name)):  # a bag that does not open (damaged metadata, unknown version): before the build too
            from livox_infer.bags import bag_info

            bag_info(name)
    for flag, value in (("--out", args.out), ("--out-bag", args.out_bag)):  # --bev-dir is created
        if not value or value == "-":
            continue
        parent = Path(value).absolute().parent
        if not parent.is_dir():
            raise ConfigError(f"{flag} {value}: folder {parent} does not exist (create it first)")


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from livox_infer.tools import fleet

    if fleet.is_batch(args):
        return fleet.main(args)
    if not args.input or not args.out:
        print("livox-infer detect: give INPUT... --out FILE (one output), or --out-dir DIR (one output per input)",
              file=sys.stderr)
        return 2
    writer = None
    out = None
    done = False
    try:
        from livox_infer.rig import Rig

        storage = out_bag_storage(args.out_bag, args.out_bag_storage) if args.out_bag else None
        rig = Rig.load(args.rig) if args.rig else None
        _check_paths(args)  # before the pipeline build (seconds): a typo is reported at once
        pipe = build_pipeline(args, rig)
        if pipe.compile_error:
            print(f"livox-infer detect: compile failed, running eagerly ({pipe.compile_error})", file=sys.stderr)
        startup = getattr(pipe, "startup", None)  # test doubles of the pipeline have none
        if startup is not None:
            print(f"livox-infer detect: pipeline ready ({startup.summary()})", file=sys.stderr)
        extent = pipe.cfg.grid.region
        bev_dir = Path(args.bev_dir) if args.bev_dir else None
        if bev_dir:
            bev_dir.mkdir(parents=True, exist_ok=True)
        if args.out_bag:
            from livox_infer.bags import BagWriter

            writer = BagWriter(args.out_bag, storage=storage)
        out = sys.stdout if args.out == "-" else open(args.out, "w")
        n = 0
        latencies = []
        mismatched, last_mount = 0, None  # frames levelled far from the ground their clouds show (ground.py)
        # tracking needs time: bags (one tracker per topic); point files are numbered, not stamped
        track = bool(args.tracking) and not args.rig and all(is_bag(Path(i)) for i in args.input)
        if track:  # the tracker's second association takes the boxes scoring just below the thresholds (as the node)
            pipe.update(candidate_score=DEFAULTS["tracking_low_score"])
        trackers: dict = {}
        poses = None
        if args.odometry_topic and not args.rig and all(is_bag(Path(i)) for i in args.input):
            from livox_infer.accumulate import PoseBuffer
            from livox_infer.bags import read_poses

            poses = PoseBuffer(maxlen=1_000_000)  # the tracker's and the stack's poses, as the node's
            for name in args.input:
                for stamp, pose in read_poses(name, args.odometry_topic):
                    poses.add(stamp, pose)
        stacked = args.accumulate_frames > 1 or args.accumulate_ms > 0
        for source, cloud in tqdm(iter_frames(args, rig, poses), desc="detect", unit="frame", file=sys.stderr):
            if args.max_frames is not None and n >= args.max_frames:
                break
            pose = poses.at(cloud.stamp_ns) if poses is not None else None
            if track and stacked and args.track_motion and source in trackers:  # the node's accumulate_track_motion
                from livox_infer.accumulate import compensate_object_motion

                cloud, _ = compensate_object_motion(cloud, *trackers[source].predict(cloud.stamp_ns, pose))
            det = pipe.detect(cloud)
            if track:
                track_frame(trackers, source, det, cloud.stamp_ns, pipe.cfg.classes, pose)
            latencies.append(det.timings_ms["total"])
            if mount_mismatch(det.sensor_height, det.ground_height_seen) is not None:
                mismatched, last_mount = mismatched + 1, (det.sensor_height, det.ground_height_seen)
            out.write(json.dumps(detection_row(source, cloud, det)) + "\n")
            if bev_dir:
                save_bev_png(bev_dir / f"frame_{n:06d}.png", cloud.points, det.boxes, det.label_names, det.scores,
                             extent, f"{source} #{n}  {len(det)} boxes  {det.timings_ms['total']:.1f} ms")
            if writer is not None:
                write_annotated(writer, cloud, det)
            n += 1
        if n == 0:
            raise PointCloudError("no point clouds found in the input")
        lat = np.asarray(latencies)
        print(f"{n} frames, latency p50 {np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms",
              file=sys.stderr)
        if mismatched:
            print(f"livox-infer detect: WARNING: {mismatched} of {n} frames: {mount_message(*last_mount, node=False)}",
                  file=sys.stderr)
        done = True
        return 0
    except (LivoxInferError, ConfigError) as exc:
        print(f"livox-infer detect: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output that cannot be written (permissions, a full disk)
        print(f"livox-infer detect: cannot write {exc.filename or 'the output'}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    finally:
        if out is not None and out is not sys.stdout:
            out.close()
        if writer is not None:
            writer.close()
            if not done:  # an incomplete bag would only block the rerun (BagWriter never overwrites)
                shutil.rmtree(writer.path, ignore_errors=True)
