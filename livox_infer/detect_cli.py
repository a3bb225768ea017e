"""`livox-infer detect INPUT --out detections.jsonl`: run the detector over a bag or point files, no ROS.

INPUT: a rosbag2 (directory, .db3 or .mcap; PointCloud2 in any layout or Livox CustomMsg), one or
more .pcd/.bin files, or a directory of them. One JSON line per frame:
``{"stamp": ns, "frame_id": str, "source": str, "latency_ms": float, "timings_ms": {...},
"sensor_height": m, "boxes": [{"label", "score", "x", "y", "z", "l", "w", "h", "yaw"}, ...]}``.
Optional: ``--bev-dir`` writes a bird's-eye PNG per frame, ``--out-bag`` a rosbag2 with the clouds
and the detections (vision_msgs/Detection3DArray on /livox_infer/detections) for RViz / Foxglove.
``--out-dir DIR`` instead of ``--out`` runs over an archive (one output per recording, a resumable
manifest, optionally on Ray): see livox_infer/fleet.py and docs/fleet.md.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

from livox_infer.errors import ConfigError, LivoxInferError, PointCloudError
from livox_infer.pointcloud import Cloud
from livox_infer.threads import add_threads_argument

POINT_SUFFIXES = (".pcd", ".bin", ".npy")
DETECTIONS_TOPIC = "/livox_infer/detections"
CLASS_COLORS = {"car": "tab:red", "pedestrian": "tab:green", "cyclist": "tab:blue"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", nargs="*", help="rosbag2 (dir/.db3/.mcap), .pcd/.bin/.npy files, or a directory of them; "
                   "with --out-dir: directories are searched recursively and @FILE names a list of inputs")
    p.add_argument("--out", help="detections JSONL file ('-' for stdout); or --out-dir")
    p.add_argument("--topic", default=None, help="cloud topic in the bag (default: every cloud topic)")
    p.add_argument("--model", default="lite", help="model config: lite, full or a YAML path")
    p.add_argument("--weights", default=None, help="safetensors weights (default: the config's)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--no-compile", action="store_true", help="run the network eagerly")
    p.add_argument("--aoti-package", default=None, help="AOTInductor package from `livox-infer export` (instead of compiling)")
    p.add_argument("--test-time-flip", action="store_true", help="average the frame and its mirror image (~2x network time)")
    p.add_argument("--no-refine", action="store_true", help="stage 1 alone: skip the stage-2 refiner of models with a refine section")
    p.add_argument("--sensor-height", default="auto", help="metres from the sensor down to the ground, or 'auto'")
    p.add_argument("--sensor-tilt", type=float, nargs=2, metavar=("PITCH_DEG", "ROLL_DEG"), default=None,
                   help="known mounting tilt (default: estimated from each cloud)")
    p.add_argument("--intensity-scale", type=float, default=None, help="full-scale intensity (255 Livox, 1 for 0-1)")
    p.add_argument("--score-threshold", type=float, default=None, help="one score threshold for every class")
    p.add_argument("--tag-filter", default="high_confidence", choices=("off", "high_confidence", "strict"))
    p.add_argument("--max-frames", type=int, default=None)
    p.add_argument("--bev-dir", default=None, help="write a bird's-eye PNG per frame here")
    p.add_argument("--out-bag", default=None, help="write clouds + Detection3DArray into this new rosbag2")
    p.add_argument("--out-bag-storage", default="sqlite3", choices=("sqlite3", "mcap"))
    add_threads_argument(p)
    from livox_infer.fleet import add_arguments as add_fleet_arguments

    add_fleet_arguments(p)
    add_rig_arguments(p)


def add_rig_arguments(p: argparse.ArgumentParser) -> None:
    from livox_infer.presets import SENSOR_PRESETS

    p.add_argument("--sensor", default=None, choices=SENSOR_PRESETS,
                   help="apply config/<sensor>.yaml as the node does (thresholds, ROI, range, tag filter, sensor "
                        "height, grid); --device/--no-compile/--weights/--aoti-package still apply")
    p.add_argument("--rig", default=None, help="rig YAML (docs/rigs.md): INPUT is a directory with one sub-folder "
                   "per rig sensor; their clouds are merged into the rig's output frame and detected once")
    p.add_argument("--accumulate-frames", type=int, default=1, help="detect on the last N frames stacked")
    p.add_argument("--accumulate-ms", type=float, default=0.0, help="... only frames within T ms of the newest")


def pipeline_kwargs(args: argparse.Namespace, rig=None) -> dict:
    """DetectionPipeline options of the detect flags, then the --sensor preset's, then the rig's."""
    try:
        sh = args.sensor_height if args.sensor_height == "auto" else float(args.sensor_height)
    except ValueError:
        raise ConfigError(f"--sensor-height must be metres or 'auto', got {args.sensor_height!r}") from None
    opts = dict(model=args.model, weights=args.weights, device=args.device, compile=not args.no_compile,
                sensor_height=sh, sensor_tilt=tuple(args.sensor_tilt) if args.sensor_tilt else "auto",
                intensity_scale=args.intensity_scale, score_thresholds=args.score_threshold,
                tag_filter=args.tag_filter, aoti_package=args.aoti_package, test_time_flip=args.test_time_flip,
                refine=not args.no_refine)
    if args.sensor:
        from livox_infer.presets import load_preset, pipeline_options

        runtime = ("device", "compile", "weights", "aoti_package")  # this machine's choices, not the preset's
        opts.update({k: v for k, v in pipeline_options(load_preset(args.sensor)).items() if k not in runtime})
        opts["sensor_tilt"] = "auto"  # as the node: the preset fixes the height, the tilt is estimated
    if rig is not None:
        from livox_infer.rig import rig_pipeline_options

        opts.update(rig_pipeline_options(rig))
    return opts


def iter_frames(args: argparse.Namespace, rig=None) -> Iterator[tuple[str, Cloud]]:
    """(source, Cloud) as the pipeline should see them: merged over the rig's sensors and / or accumulated."""
    from livox_infer.rig import FrameAssembler, read_rig_directory

    frames, window = args.accumulate_frames, args.accumulate_ms
    if rig is None and frames == 1 and window == 0:
        yield from iter_inputs(args.input, args.topic)
        return
    if rig is not None:
        if len(args.input) != 1 or not Path(args.input[0]).is_dir():
            raise PointCloudError("with --rig, INPUT is one directory with a sub-folder per rig sensor")
        asm = FrameAssembler(rig, frames, window)
        for source, name, cloud in read_rig_directory(rig, args.input[0]):
            for merged in asm.add(name, cloud):
                yield source.split("/")[-1], merged
        for merged in asm.flush():
            yield "last", merged
        return
    from livox_infer.accumulate import Accumulator

    acc = Accumulator(frames, window)  # one stream: nothing to merge (point files carry no stamps: index order)
    for source, cloud in iter_inputs(args.input, args.topic):
        yield source, acc.add(cloud)


def is_bag(path: Path) -> bool:
    return (path.is_dir() and (path / "metadata.yaml").is_file()) or path.suffix in (".db3", ".mcap")


def iter_inputs(inputs: list[str], topic: str | None) -> Iterator[tuple[str, Cloud]]:
    """(source name, raw Cloud) for every frame of every input, in order."""
    from livox_infer.pointfiles import read_points_file

    for name in inputs:
        path = Path(name)
        if not path.exists():
            raise PointCloudError(f"input not found: {path}")
        if is_bag(path):
            from livox_infer.bag import read_clouds

            for t, cloud in read_clouds(path, topic):
                yield t, cloud
            continue
        files = sorted(q for q in path.iterdir() if q.suffix.lower() in POINT_SUFFIXES) if path.is_dir() else [path]
        if path.is_dir() and not files:
            raise PointCloudError(f"{path} is neither a rosbag2 nor a directory with .pcd/.bin/.npy files")
        for i, f in enumerate(files):
            if f.suffix.lower() not in POINT_SUFFIXES:
                raise PointCloudError(f"{f}: expected a rosbag2, .pcd, .bin or .npy file")
            yield f.name, Cloud(read_points_file(f), stamp_ns=i, frame_id="livox_frame")


def _box_corners(box: np.ndarray) -> np.ndarray:
    x, y, _, l, w, _, yaw = box
    c, s = math.cos(yaw), math.sin(yaw)
    loc = np.array([[l / 2, w / 2], [-l / 2, w / 2], [-l / 2, -w / 2], [l / 2, -w / 2], [l / 2, w / 2]])
    return loc @ np.array([[c, s], [-s, c]]) + [x, y]


def save_bev_png(path: Path, points: np.ndarray, boxes: np.ndarray, names: list[str], scores: np.ndarray,
                 extent: tuple[float, float, float, float], title: str = "", gt=None) -> None:
    """Points (coloured by height) and boxes (class colour, heading tick, "cls score") seen from above.

    ``gt`` = (boxes, names, ignored) adds labelled boxes, dashed (grey where ignored)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x0, x1, y0, y1 = extent
    fig, ax = plt.subplots(figsize=(7, 7), dpi=100)
    sel = (points[:, 0] >= x0) & (points[:, 0] <= x1) & (points[:, 1] >= y0) & (points[:, 1] <= y1)
    p = points[sel]
    ax.scatter(p[:, 1], p[:, 0], s=0.3, c=p[:, 2], cmap="viridis", vmin=np.percentile(p[:, 2], 2) if len(p) else 0,
               vmax=np.percentile(p[:, 2], 98) if len(p) else 1, linewidths=0)
    if gt is not None:
        for box, name, ignored in zip(*gt):
            c = _box_corners(box)
            ax.plot(c[:, 1], c[:, 0], color="0.6" if ignored else CLASS_COLORS.get(name, "black"), lw=0.9, ls="--")
    for box, name, score in zip(boxes, names, scores):
        c = _box_corners(box)
        color = CLASS_COLORS.get(name, "black")
        ax.plot(c[:, 1], c[:, 0], color=color, lw=1.2)
        head = box[:2] + 0.5 * box[3] * np.array([math.cos(box[6]), math.sin(box[6])])
        ax.plot([box[1], head[1]], [box[0], head[0]], color=color, lw=1.0)
        ax.text(box[1], box[0], f"{name[:3]} {score:.2f}", fontsize=6, color=color)
    ax.set_xlim(y1, y0)  # y to the left, as seen from above with x up
    ax.set_ylim(x0, x1)
    ax.set_aspect("equal")
    ax.set_xlabel("y [m]")
    ax.set_ylabel("x [m]")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def build_pipeline(args: argparse.Namespace, rig=None):
    """The DetectionPipeline the detect options describe (also built by the archive workers, livox_infer/fleet.py);
    ``rig``: the already loaded --rig file (loaded here when not given)."""
    from livox_infer.pipeline import DetectionPipeline
    from livox_infer.rig import Rig

    if rig is None and getattr(args, "rig", None):
        rig = Rig.load(args.rig)
    return DetectionPipeline(**pipeline_kwargs(args, rig))


def detection_row(source: str, cloud: Cloud, det) -> dict:
    """One JSONL row: a frame's detections (the format in the module docstring)."""
    return {
        "stamp": int(cloud.stamp_ns), "frame_id": cloud.frame_id, "source": source,
        "latency_ms": round(det.timings_ms["total"], 3),
        "timings_ms": {k: round(v, 3) for k, v in det.timings_ms.items()},
        "sensor_height": round(det.sensor_height, 3), "boxes": det.to_dicts(),
    }


def write_annotated(writer, cloud: Cloud, det) -> None:
    """The cloud (xyzi PointCloud2 on /livox/lidar) and its detections into an open BagWriter."""
    from livox_infer.pointcloud import encode_pointcloud2

    frame_id = cloud.frame_id or "livox_frame"
    writer.write_cloud("/livox/lidar", encode_pointcloud2(cloud.points, "xyzi", stamp_ns=cloud.stamp_ns, frame_id=frame_id))
    writer.write_detections(DETECTIONS_TOPIC, cloud.stamp_ns, frame_id, det.boxes, det.labels, det.scores)


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from livox_infer import fleet

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

        rig = Rig.load(args.rig) if args.rig else None
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
            from livox_infer.bag import BagWriter

            writer = BagWriter(args.out_bag, storage=args.out_bag_storage)
        out = sys.stdout if args.out == "-" else open(args.out, "w")
        n = 0
        latencies = []
        for source, cloud in tqdm(iter_frames(args, rig), desc="detect", unit="frame", file=sys.stderr):
            if args.max_frames is not None and n >= args.max_frames:
                break
            det = pipe.detect(cloud)
            latencies.append(det.timings_ms["total"])
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
        done = True
        return 0
    except (LivoxInferError, ConfigError) as exc:
        print(f"livox-infer detect: {exc}", file=sys.stderr)
        return 2
    finally:
        if out is not None and out is not sys.stdout:
            out.close()
        if writer is not None:
            writer.close()
            if not done:  # an incomplete bag would only block the rerun (BagWriter never overwrites)
                shutil.rmtree(writer.path, ignore_errors=True)
