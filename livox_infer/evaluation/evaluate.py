"""`livox-infer eval`: AP of a detector on a bag with ground truth, on held-out simulated frames, on real
labelled scans (`--real`, `livox_infer.evaluation.real`) or on an archive's detections (`--detections-dir`).
The metrics are `livox_infer.evaluation.metrics`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


from livox_infer.errors import ConfigError, LivoxInferError
from livox_infer.params import DEFAULTS, add_cli_options, parse_sensor_height
from livox_infer.evaluation.metrics import DEFAULT_MIN_POINTS, FrameBoxes, align_frames, evaluate, range_bins, read_jsonl, summary_table
from livox_infer.evaluation.simulated import evaluate_on_simulation, gt_from_bag, scan_detector
from livox_infer.evaluation.options import eval_region, parse_ranges, parse_sim_options, sim_sensors


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", nargs="?", help="rosbag2 with clouds and ground truth (omit with --sim-frames)")
    p.add_argument("--sim-frames", type=int, default=None,
                   help="instead of a bag: this many freshly simulated held-out frames per sensor")
    p.add_argument("--sensors", default="mid40,mid70,tele15,horizon,avia", help="sensors for --sim-frames")
    p.add_argument("--seed", type=int, default=0, help="seed of the --sim-frames scenes")
    p.add_argument("--detections", help="detections JSONL from `livox-infer detect`; default: run the detector now")
    p.add_argument("--labels", help="ground truth as a JSONL file instead of the bag's GT topic")
    p.add_argument("--gt-topic", default="/livox_infer/ground_truth")
    p.add_argument("--cloud-topic", default=None, help="cloud topic (counts GT points; detection input)")
    # None = not given: the --sensor preset's value (or the default) applies
    add_cli_options(p, ("model", "weights", "device", "compile", "precision", "sensor_height", "threads"), sensor_height=None,
                    helps={"sensor_height": "metres from the sensor down to the ground, or 'auto': estimated per "
                           "cloud (default: the --sensor preset's, else auto)"})
    p.add_argument("--test-time-flip", action="store_true", default=None, help="average the frame and its mirror image")
    p.add_argument("--no-refine", action="store_true", default=None,
                   help="stage 1 alone: skip the stage-2 refiner of models with a refine section")
    p.add_argument("--baseline", action="store_true", help="also evaluate the non-learned baseline")
    p.add_argument("--min-points", type=int, default=DEFAULT_MIN_POINTS, help="ignore GT with fewer lidar points")
    p.add_argument("--region", type=float, nargs=4, metavar=("X0", "X1", "Y0", "Y1"),
                   help="evaluate only inside this BEV rectangle (default: the model's grid)")
    p.add_argument("--score-threshold", default=None,
                   help="keep detections down to this score for the AP ranking (default 0.1, as OpenPCDet "
                        "evaluates; with --tracking 'config'); 'config': the model config's per-class operating "
                        "thresholds")
    p.add_argument("--sim-option", action="append", default=[], metavar="KEY=VALUE",
                   help="simulate_frame option for --sim-frames, e.g. 'ego_speed=[0,15]' "
                        "'yaw_rate_dps=[-15,15]' (a moving, turning vehicle); repeatable")
    p.add_argument("--ranges", default=None, metavar="EDGES",
                   help="also report AP per range bin of the object's BEV distance from the sensor, e.g. "
                        "'0,20,40,inf' (pooled over sensors, or per source with --real; GT and detections outside a bin "
                        "are left out)")
    p.add_argument("--confusion", action="store_true",
                   help="with --sim-frames or --real: also print what became of each labelled object per class: "
                        "right, boxed well but called another class, poorly placed, no box "
                        "(livox_infer/evaluation/confusion.py)")
    p.add_argument("--bev-extent", type=float, nargs=4, metavar=("X0", "X1", "Y0", "Y1"), default=None,
                   help="run the network on this BEV extent in metres (multiples of 3.2 for lite) instead of the "
                        "model's, e.g. 0 80 -51.2 51.2 for an 80 m, ±40° cone; the same weights")
    p.add_argument("--out", help="write the results as JSON here")
    from livox_infer.evaluation.archive import add_arguments as add_archive_arguments
    add_cli_options(p, ("sensor",), sensor=None, helps={"sensor":
                    "apply the preset config/<sensor>.param.yaml as the node does (ROI, range, tag filter, sensor height, grid; "
                        "the AP ranking keeps --score-threshold); with --sim-frames, simulate this sensor only"})
    p.add_argument("--tracking", action="store_true",
                   help="with --sim-frames N: track simulated drives of N frames (sensor standing and moving) and "
                        "report MOTA, ID switches and velocity error per class (livox_infer/evaluation/tracking.py)")
    p.add_argument("--sim-sequences", type=int, default=3, metavar="S",
                   help="with --tracking: drives per sensor and condition (default %(default)s)")
    p.add_argument("--sim-accumulate", type=int, default=None, metavar="K",
                   help="with --sim-frames: score each frame alone and its drive's last K frames stacked, with and "
                        "without poses (livox_infer/evaluation/accumulated.py)")
    from livox_infer.evaluation.real import add_arguments as add_real_arguments

    add_real_arguments(p)
    add_archive_arguments(p)


def _default_score_threshold(args: argparse.Namespace) -> str:
    """--score-threshold when given; else the operating thresholds for --tracking (what a user's tracker sees) and
    0.1 for AP (the ranking goes down to 0.1)."""
    if args.score_threshold is not None:
        return args.score_threshold
    return "config" if getattr(args, "tracking", False) else "0.1"


def _score_thresholds(value: str):
    """None (the config's) for 'config', else one float for every class."""
    if str(value).strip().lower() == "config":
        return None
    try:
        v = float(value)
    except ValueError as exc:
        raise ConfigError(f"--score-threshold must be a number in [0, 1] or 'config', got {value!r}") from exc
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"--score-threshold must be a number in [0, 1] or 'config', got {value!r}")
    return v


def main(args: argparse.Namespace) -> int:
    from livox_infer.detector.config import ModelConfig

    args.score_threshold = _default_score_threshold(args)
    try:
        parse_ranges(args.ranges)  # a bad --ranges fails before any detection runs
        if getattr(args, "confusion", False) and not (args.real or (args.sim_frames and not args.tracking
                                                                    and not args.sim_accumulate)):
            raise ConfigError("--confusion works with --sim-frames N (without --tracking / --sim-accumulate) or --real DIR")
        if getattr(args, "thin_beams", 1) != 1 and not args.real:
            raise ConfigError("--thin-beams thins the laser rings of real scans: it works with --real DIR")
        if args.tracking:
            from livox_infer.evaluation.tracking import main_tracking

            if not args.sim_frames:
                raise ConfigError("--tracking needs --sim-frames N (frames per simulated drive)")
            return main_tracking(args, _pipeline(args))
        if args.detections_dir:
            from livox_infer.evaluation.archive import main_archive

            return main_archive(args)
        if args.real:
            from livox_infer.evaluation.real import main_real

            return main_real(args, lambda weights=None, model=None: _pipeline(args, weights, model))
        if args.sim_frames and args.sim_accumulate:
            from livox_infer.evaluation.accumulated import main_accumulated

            return main_accumulated(args, _pipeline(args))
        if args.sim_frames:
            return _main_sim(args)
        if not args.input:
            raise ConfigError("give a bag (INPUT) or --sim-frames N")
        clouds: dict[int, Any] = {}
        if args.labels:
            gts = read_jsonl(args.labels)
        else:
            gts, clouds = gt_from_bag(args.input, args.gt_topic, args.cloud_topic)
        if not gts:
            raise ConfigError("no ground-truth frames found")
        cfg = ModelConfig.load(args.model)
        region = eval_region(args, cfg)
        results: dict[str, Any] = {"min_points": args.min_points, "region": list(region),
                                   "score_threshold": args.score_threshold, "test_time_flip": bool(args.test_time_flip),
                                   "refine": not args.no_refine}
        runs: list[tuple[str, list[FrameBoxes]]] = []
        if args.detections:
            runs.append(("detections", read_jsonl(args.detections)))
        else:
            if not clouds:
                from livox_infer.bags import read_clouds

                clouds = {c.stamp_ns: c for _, c in read_clouds(args.input, args.cloud_topic)}
            pipe = _pipeline(args)
            dets = []
            for stamp, cloud in clouds.items():
                d = pipe.detect(cloud)
                dets.append(FrameBoxes(d.boxes, d.labels, d.scores, None, stamp))
            runs.append((f"model {cfg.name}", dets))
        if args.baseline:
            from livox_infer.evaluation.baseline import BaselineDetector

            if not clouds:
                from livox_infer.bags import read_clouds

                clouds = {c.stamp_ns: c for _, c in read_clouds(args.input, args.cloud_topic)}
            base = BaselineDetector(sensor_height=_sensor_height(args))
            dets = []
            for stamp, cloud in clouds.items():
                b = base.detect(cloud.points)
                dets.append(FrameBoxes(b.boxes, b.labels, b.scores, None, stamp))
            runs.append(("baseline", dets))
        bins = range_bins(parse_ranges(args.ranges))
        for name, dets in runs:
            d_al, g_al = align_frames(dets, gts)
            res = evaluate(d_al, g_al, cfg.classes, args.min_points, region)
            print(res.table(f"== {name}: {res.num_frames} frames, AP (R40), GT with < {args.min_points} points ignored =="))
            results[name] = res.to_dict()
            for label, rb in bins:
                r = evaluate(d_al, g_al, cfg.classes, args.min_points, region, range_bin=rb)
                print(r.table(f"-- {name}, objects at {label} from the sensor --"))
                results[name].setdefault("by_range", {})[label] = r.to_dict()
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2, allow_nan=True))
        return 0
    except LivoxInferError as exc:
        print(f"livox-infer eval: {exc}", file=sys.stderr)
        return 2


def _pipeline(args: argparse.Namespace, weights: str | None = None, model: str | None = None):
    """The detection pipeline the eval options describe: the --sensor preset's options (else the defaults), then
    every option given on the command line; the model, weights, how to run and the AP ranking threshold always
    come from the command line (``weights`` / ``model``: other weights or another model, e.g. --paired-with)."""
    from livox_infer.pipeline import DetectionPipeline
    from livox_infer.presets import cli_pipeline_options

    given = dict(sensor_height=_sensor_height(args, None), test_time_flip=args.test_time_flip,
                 refine=None if args.no_refine is None else not args.no_refine,
                 bev_extent=getattr(args, "bev_extent", None))
    command_line = dict(model=model or args.model, weights=weights or (None if model else args.weights),
                        device=args.device, compile=args.compile, precision=args.precision, aoti_package=None,
                        score_thresholds=_score_thresholds(_default_score_threshold(args)))
    return DetectionPipeline(**cli_pipeline_options(getattr(args, "sensor", None), given, command_line,
                                                    defaults=dict(sensor_height="auto",
                                                                  test_time_flip=DEFAULTS["test_time_flip"],
                                                                  refine=DEFAULTS["refine"])))


def _sensor_height(args: argparse.Namespace, default: float | str | None = "auto"):
    """--sensor-height parsed, or ``default`` when it was not given."""
    return default if args.sensor_height is None else parse_sensor_height(args.sensor_height)


def _main_sim(args: argparse.Namespace) -> int:
    pipe = _pipeline(args)
    cfg = pipe.cfg
    region = eval_region(args, cfg)
    sh = _sensor_height(args)
    sim_options = parse_sim_options(args.sim_option)
    fns = {f"model {cfg.name}": scan_detector(pipe)}
    if args.baseline:
        from livox_infer.evaluation.baseline import BaselineDetector

        base = BaselineDetector(sensor_height=sh)

        def base_fn(points):
            b = base.detect(points)
            return b.boxes, b.labels, b.scores

        fns["baseline"] = base_fn
    sensors = sim_sensors(args)
    collected: dict | None = {} if (args.reliability or args.confusion) else None
    res = evaluate_on_simulation(fns, sensors, args.sim_frames, args.seed, cfg.classes, args.min_points, region,
                                 sim_options=sim_options, ranges=parse_ranges(args.ranges), collected=collected)
    out: dict[str, Any] = {"min_points": args.min_points, "region": list(region), "frames_per_sensor": args.sim_frames,
                           "seed": args.seed, "sensor_height": _sensor_height(args), "sim_options": sim_options,
                           "score_threshold": args.score_threshold,
                           "test_time_flip": bool(args.test_time_flip), "refine": not args.no_refine}
    for name, per in res.items():
        print(summary_table(per, f"== {name}: {args.sim_frames} held-out simulated frames per sensor, "
                                 f"AP R40, GT with < {args.min_points} points ignored =="))
        out[name] = {sensor: r.to_dict() for sensor, r in per.items()}
    if collected and args.reliability:
        from livox_infer.evaluation.calibration import simulated_reliability

        dets, gts = collected[f"model {cfg.name}"]
        out["reliability"] = simulated_reliability(dets, gts, cfg, args.min_points, region,
                                                   res[f"model {cfg.name}"]["all"].num_gt)
    if collected and args.confusion:
        from livox_infer.evaluation.confusion import confusion_report
        from livox_infer.evaluation.metrics import scored_in_region

        dets, gts = collected[f"model {cfg.name}"]
        kept, ignore = scored_in_region(dets, gts, args.min_points, region)
        out["confusion"] = confusion_report(kept, gts, ignore, cfg.classes, "the simulated frames")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2, allow_nan=True))
    return 0
