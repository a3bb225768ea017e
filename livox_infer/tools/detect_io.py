"""What `livox-infer detect` and its archive runs share: the inputs (point files, bags, rigs), the pipeline the
options describe, and the outputs (JSONL rows, annotated bags, BEV pictures)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator


from livox_infer.errors import PointCloudError
from livox_infer.decode.pointcloud import Cloud


POINT_SUFFIXES = (".pcd", ".bin", ".npy")


DETECTIONS_TOPIC = "/livox_infer/detections"


def pipeline_kwargs(args: argparse.Namespace, rig=None) -> dict:
    """DetectionPipeline options: the --sensor preset's (else the defaults), then every detect flag given on the
    command line (None = not given), then the rig's. The model, weights and how to run (device, compile, AOTI
    package) always come from the command line."""
    from livox_infer.params import DEFAULTS, parse_sensor_height
    from livox_infer.presets import cli_pipeline_options

    given = dict(sensor_height=None if args.sensor_height is None else parse_sensor_height(args.sensor_height),
                 sensor_tilt=tuple(args.sensor_tilt) if args.sensor_tilt else None,
                 intensity_scale=args.intensity_scale, score_thresholds=args.score_threshold,
                 tag_filter=args.tag_filter, test_time_flip=args.test_time_flip,
                 refine=None if args.no_refine is None else not args.no_refine)
    command_line = dict(model=args.model, weights=args.weights, device=args.device, compile=args.compile,
                        precision=args.precision, aoti_package=args.aoti_package)
    opts = cli_pipeline_options(args.sensor, given, command_line, defaults=dict(
        sensor_height="auto", tag_filter=DEFAULTS["tag_filter"], test_time_flip=DEFAULTS["test_time_flip"],
        refine=DEFAULTS["refine"]))  # with a preset, the tilt is estimated (the pipeline's default), as in the node
    if rig is not None:
        from livox_infer.rig import rig_pipeline_options

        opts.update(rig_pipeline_options(rig))
    return opts


def iter_frames(args: argparse.Namespace, rig=None, poses=None) -> Iterator[tuple[str, Cloud]]:
    """(source, Cloud) as the pipeline should see them: merged over the rig's sensors and / or accumulated;
    ``poses`` (a PoseBuffer, the bag's odometry): one stream's stack is motion-compensated with them, as the node's."""
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
        for name, n in asm.outside_grid.items():
            if n:
                print(f"warning: {asm.outside_grid_warning(name)}", file=sys.stderr)
        return
    from livox_infer.accumulate import Accumulator

    acc = Accumulator(frames, window)  # one stream: nothing to merge (point files carry no stamps: index order)
    for source, cloud in iter_inputs(args.input, args.topic):
        yield source, acc.add(cloud, None if poses is None else poses.at(cloud.stamp_ns))


def is_bag(path: Path) -> bool:
    return (path.is_dir() and (path / "metadata.yaml").is_file()) or path.suffix in (".db3", ".mcap")


def iter_inputs(inputs: list[str], topic: str | None,
                on_bad_message=None) -> Iterator[tuple[str, Cloud]]:
    """(source name, raw Cloud) for every frame of every input, in order. ``on_bad_message(reason)``: a bag message
    that does not decode is reported there and skipped instead of raising (bags.read_clouds)."""
    from livox_infer.decode.pointfiles import read_points_file

    for name in inputs:
        path = Path(name)
        if not path.exists():
            raise PointCloudError(f"input not found: {path}")
        if is_bag(path):
            from livox_infer.bags import read_clouds

            for t, cloud in read_clouds(path, topic, on_bad_message=on_bad_message):
                yield t, cloud
            continue
        files = sorted(q for q in path.iterdir() if q.suffix.lower() in POINT_SUFFIXES) if path.is_dir() else [path]
        if path.is_dir() and not files:
            raise PointCloudError(f"{path} is neither a rosbag2 nor a directory with .pcd/.bin/.npy files")
        for i, f in enumerate(files):
            if f.suffix.lower() not in POINT_SUFFIXES:
                raise PointCloudError(f"{f}: expected a rosbag2, .pcd, .bin or .npy file")
            yield f.name, Cloud(read_points_file(f), stamp_ns=i, frame_id="livox_frame")


def build_pipeline(args: argparse.Namespace, rig=None):
    """The DetectionPipeline the detect options describe (also built by the archive workers, livox_infer/tools/fleet.py);
    ``rig``: the already loaded --rig file (loaded here when not given)."""
    from livox_infer.pipeline import DetectionPipeline
    from livox_infer.rig import Rig

    if rig is None and getattr(args, "rig", None):
        rig = Rig.load(args.rig)
    return DetectionPipeline(**pipeline_kwargs(args, rig))


def detection_row(source: str, cloud: Cloud, det) -> dict:
    """One JSONL row: a frame's detections (the format in the module docstring). A tracked frame (``det.track_ids``
    and ``det.tracks`` set by :func:`track_frame`) adds ``track_id`` per box (0: no confirmed track) and, for boxes
    of a confirmed track, ``vx``, ``vy`` (m/s, the cloud frame's axes; over ground when tracked with poses, else
    relative to the sensor) and ``yaw_rate`` (rad/s)."""
    boxes = det.to_dicts()
    track_ids = getattr(det, "track_ids", None)
    tracks = getattr(det, "tracks", None)
    if track_ids is not None and tracks is not None:
        by_id = {int(t): i for i, t in enumerate(tracks.track_ids)}
        for box, tid in zip(boxes, track_ids):
            box["track_id"] = int(tid)
            i = by_id.get(int(tid))
            if i is not None:
                box["vx"], box["vy"] = (round(float(v), 3) for v in tracks.velocities[i])
                box["yaw_rate"] = round(float(tracks.yaw_rates[i]), 4)
    return {
        "stamp": int(cloud.stamp_ns), "frame_id": cloud.frame_id, "source": source,
        "latency_ms": round(det.timings_ms["total"], 3),
        "timings_ms": {k: round(v, 3) for k, v in det.timings_ms.items()},
        "sensor_height": round(det.sensor_height, 3), "boxes": boxes,
    }


def track_frame(trackers: dict, source: str, det, stamp_ns: int, classes, pose=None) -> None:
    """Track ``det`` with the tracker of its stream ``source`` (made on first use from the parameter table's
    tracking defaults) and set ``det.track_ids`` / ``det.tracks``; ``pose`` (4x4, odometry at the cloud's stamp):
    velocities over ground, else relative to the sensor."""
    from livox_infer.params import DEFAULTS, class_params
    from livox_infer.tracking import Tracker, TrackerConfig, candidates_of

    tracker = trackers.get(source)
    if tracker is None:
        values = {**DEFAULTS, **{p.name: p.default for p in class_params()}}
        tracker = trackers[source] = Tracker(TrackerConfig.from_params(values), tuple(classes))
    tracks = tracker.update(det.boxes, det.labels, det.scores, int(stamp_ns), pose, candidates_of(det))
    det.track_ids, det.tracks = tracks.detection_track_ids, tracks


def write_annotated(writer, cloud: Cloud, det) -> None:
    """The cloud (xyzi PointCloud2 on /livox/lidar) and its detections into an open BagWriter."""
    from livox_infer.decode.pointcloud import encode_pointcloud2

    frame_id = cloud.frame_id or "livox_frame"
    writer.write_cloud("/livox/lidar", encode_pointcloud2(cloud.points, "xyzi", stamp_ns=cloud.stamp_ns, frame_id=frame_id))
    writer.write_detections(DETECTIONS_TOPIC, cloud.stamp_ns, frame_id, det.boxes, det.labels, det.scores)
