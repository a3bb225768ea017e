"""End-to-end demo (``make demo`` / ``python -m livox_infer.tools.demo``), no GPU needed.

1. simulates a short Avia drive into a rosbag2 (clouds + ground truth), with ``livox-infer simulate``;
2. starts the detector node in this process (ROS 2 on loopback, an isolated ROS_DOMAIN_ID);
3. replays the bag through ROS with its recorded 10 Hz timing (replay → node → detections);
4. prints, per frame, what was detected against the ground truth (matched by class and centre
   distance, with the BEV IoU of each match) and the latencies, then writes a bird's-eye picture
   (points, ground truth, detections) to out/demo_bev.png.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from livox_infer import CLASS_NAMES
from livox_infer.tools.bev_plot import save_bev_png
from livox_infer.params import DEFAULTS



@dataclass
class FrameResult:
    stamp_ns: int
    gt_names: list[str]
    gt_boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 7), np.float32))
    det_names: list[str] = field(default_factory=list)
    processed: bool = False
    matches: list[tuple[int, int, float, float]] = field(default_factory=list)  # (det, gt, dist, iou)
    latency_ms: float = float("nan")  # replay publish -> Detection3DArray received

    @property
    def tp(self) -> int:
        return len(self.matches)

    @property
    def fp(self) -> int:
        return len(self.det_names) - self.tp

    @property
    def fn(self) -> int:
        return len(self.gt_names) - self.tp


def match_frame(det_boxes, det_names, det_scores, gt_boxes, gt_names) -> list[tuple[int, int, float, float]]:
    """Per class, the evaluation's greedy matching (`assign_frame`) at its loose BEV IoU threshold (car 0.5,
    pedestrian / cyclist 0.25). Returns (det index, gt index, centre distance, BEV IoU)."""
    from livox_infer.evaluation.metrics import IOU_THRESHOLDS, assign_frame

    det_boxes, gt_boxes = np.asarray(det_boxes, np.float64).reshape(-1, 7), np.asarray(gt_boxes, np.float64).reshape(-1, 7)
    det_names, gt_names = np.asarray(det_names, dtype=object), np.asarray(gt_names, dtype=object)
    out = []
    for name in sorted(set(det_names) & set(gt_names)):
        di, gi = np.flatnonzero(det_names == name), np.flatnonzero(gt_names == name)
        match, _, iou = assign_frame(det_boxes[di], np.asarray(det_scores)[di], gt_boxes[gi], np.zeros(len(gi), bool),
                                     IOU_THRESHOLDS.get(name, (0.5, 0.25))[1])
        for k, j in enumerate(match):
            if j >= 0:
                dist = float(np.linalg.norm(det_boxes[di[k], :2] - gt_boxes[gi[j], :2]))
                out.append((int(di[k]), int(gi[j]), dist, float(iou[k, j])))
    return sorted(out)


def _counts(names: list[str]) -> str:
    return "/".join(str(sum(n == c for n in names)) for c in CLASS_NAMES)


def print_table(frames: list[FrameResult]) -> None:
    t0 = frames[0].stamp_ns if frames else 0
    print(f"\n{'frame':>5} {'t_s':>6} {'GT c/p/cy':>10} {'det c/p/cy':>10} {'TP':>3} {'FP':>3} {'FN':>3} "
          f"{'mean IoU':>8} {'latency_ms':>10}")
    for k, f in enumerate(frames):
        if not f.processed:
            print(f"{k:>5} {(f.stamp_ns - t0) * 1e-9:>6.1f} {_counts(f.gt_names):>10}   (dropped: a newer frame arrived)")
            continue
        iou = np.mean([m[3] for m in f.matches]) if f.matches else float("nan")
        print(f"{k:>5} {(f.stamp_ns - t0) * 1e-9:>6.1f} {_counts(f.gt_names):>10} {_counts(f.det_names):>10} "
              f"{f.tp:>3} {f.fp:>3} {f.fn:>3} {iou:>8.2f} {f.latency_ms:>10.1f}")
    done = [f for f in frames if f.processed]
    tp, fp, fn = (sum(getattr(f, a) for f in done) for a in ("tp", "fp", "fn"))
    lat = np.asarray([f.latency_ms for f in done]) if done else np.asarray([np.nan])
    print(f"\nprocessed {len(done)}/{len(frames)} frames; over those: TP {tp}, FP {fp}, FN {fn}; "
          f"precision {tp / max(tp + fp, 1):.2f}, recall {tp / max(tp + fn, 1):.2f}")
    print(f"end-to-end latency (replay publish -> detections received): p50 {np.nanpercentile(lat, 50):.1f} ms, "
          f"p99 {np.nanpercentile(lat, 99):.1f} ms")


def detection_region(pipeline) -> tuple[float, float, float, float] | None:
    """(x_min, x_max, y_min, y_max) the pipeline's BEV grid covers, or None when it does not say."""
    grid = getattr(pipeline, "grid", None)
    if grid is None or not hasattr(grid, "x_range"):
        return None
    return (*map(float, grid.x_range), *map(float, grid.y_range))


@dataclass
class DemoResult:
    frames: list[FrameResult]
    bev_path: Path | None
    diagnostics: dict
    trained: bool


def simulate_bag(bag: Path, sensor: str, frames: int, seed: int, sensor_height: float) -> None:
    from livox_infer.sim.cli import SimulateOptions, simulate

    simulate(SimulateOptions(out=str(bag), sensor=sensor, frames=frames, seed=seed, sensor_height=sensor_height))

def run_demo(out_dir: str | Path = "out", *, sensor: str = "avia", frames: int = 20, seed: int = 7,
             rate: float = 1.0, device: str = "auto", use_compile: bool = False, pipeline_factory=None,
             bev: bool = True, quiet: bool = False, model: str | None = None,
             weights: str | None = None) -> DemoResult:
    """Simulate → replay through ROS → node → collect detections → compare with ground truth."""
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(120, 200)))  # away from a live robot's graph
    import rclpy
    from rclpy.context import Context
    from rclpy.parameter import Parameter
    from vision_msgs.msg import Detection3DArray

    from livox_infer.bags import read_clouds, read_detections
    from livox_infer.ros.node import DetectorNode, create_executor, params_files_for
    from livox_infer.ros.replay import BagReplayer, cdr_header_stamp_ns
    from livox_infer.ros.messages import msg_to_arrays

    say = (lambda *a, **k: None) if quiet else print
    out = Path(out_dir)
    bag = out / "demo_bag"
    if bag.exists():
        shutil.rmtree(bag)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    simulate_bag(bag, sensor, frames, seed, sensor_height=DEFAULTS["sensor_height"])  # the default mount
    gt = {f.stamp_ns: f for f in read_detections(bag)}
    say(f"simulated {frames} {sensor} frames with ground truth -> {bag} ({time.perf_counter() - t0:.1f} s)")

    ctx = Context()
    rclpy.init(context=ctx, args=[])
    executor = create_executor(ctx)
    node = None
    try:
        overrides = [Parameter("device", value=device), Parameter("use_compile", value=use_compile)]
        overrides += [Parameter(k, value=v) for k, v in (("model", model), ("weights", weights)) if v]
        node = DetectorNode(pipeline_factory=pipeline_factory, context=ctx,
                            cli_args=["--ros-args", *(x for f in params_files_for(sensor) for x in ("--params-file", f))],
                            parameter_overrides=overrides)
        trained = not str(getattr(node.pipeline, "weights_meta", {}).get("trained", "yes")).startswith("no")
        region = detection_region(node.pipeline)
        client = rclpy.create_node("livox_demo", context=ctx)
        executor.add_node(node)
        executor.add_node(client)
        received: dict[int, tuple[float, object]] = {}
        client.create_subscription(Detection3DArray, f"{node.get_fully_qualified_name()}/detections",
                                   lambda m: received.__setitem__(
                                       m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec,
                                       (time.monotonic(), m)), 20)
        sent_at: dict[int, float] = {}

        def on_publish(topic, _t, raw):
            if topic == node.get_parameter("input_topic").value:
                sent_at[cdr_header_stamp_ns(raw)] = time.monotonic()

        replayer = BagReplayer(client, bag, rate=rate, on_publish=on_publish)
        spin = threading.Thread(target=executor.spin, daemon=True)
        spin.start()
        if not replayer.wait_for_subscribers(node.get_parameter("input_topic").value, timeout_s=20):
            raise RuntimeError("the node did not subscribe to the replayed topic")
        deadline = time.monotonic() + 20
        while node._det_pub.get_subscription_count() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # let the node's subscription match the replayer's publisher too
        say(f"replaying through ROS 2 (domain {os.environ['ROS_DOMAIN_ID']}, loopback) at x{rate} ...")
        replayer.run()
        # let the node finish the frame it is on
        end = time.monotonic() + 15
        while time.monotonic() < end and (node._pending is not None or
                                           node.stats.processed + node.stats.dropped + node.stats.rejected
                                           + node.stats.empty < node.stats.received):
            time.sleep(0.05)
        time.sleep(0.3)
        diagnostics = {kv.key: kv.value for kv in node.diagnostics_status().values}
    finally:
        executor.shutdown()
        if node is not None:
            node.destroy_node()
        ctx.try_shutdown()

    from livox_infer.evaluation.metrics import in_region

    results: list[FrameResult] = []
    best = None
    for stamp, g in sorted(gt.items()):
        inside = in_region(g.boxes, region)
        g = g._replace(boxes=g.boxes[inside], labels=g.labels[inside], scores=g.scores[inside])
        names = [CLASS_NAMES[i] for i in g.labels]
        fr = FrameResult(stamp, names, np.asarray(g.boxes))
        if stamp in received:
            t_recv, msg = received[stamp]
            d = msg_to_arrays(msg)
            fr.processed = True
            fr.det_names = d.class_names
            fr.matches = match_frame(d.boxes, d.class_names, d.scores, g.boxes, names)
            if stamp in sent_at:
                fr.latency_ms = (t_recv - sent_at[stamp]) * 1e3
            key = (len(g.boxes) > 0, fr.tp, len(d.boxes))
            if best is None or key > best[0]:
                best = (key, stamp, d, g, names)
        results.append(fr)
    if not quiet:
        if region is not None:
            print(f"\nground truth counted inside the model's BEV grid: x {region[0]:g}..{region[1]:g} m, "
                  f"y {region[2]:g}..{region[3]:g} m (the detector cannot see beyond it)")
        print_table(results)
        stages = [k[len("latency_"):-len("_p50_ms")] for k in diagnostics if k.endswith("_p50_ms")]
        print("node latency per stage (ms, p50 / p99): " + ", ".join(
            f"{s} {float(diagnostics[f'latency_{s}_p50_ms']):.1f}/{float(diagnostics[f'latency_{s}_p99_ms']):.1f}"
            for s in stages))
        print(f"node: backend {diagnostics.get('backend')}, model {diagnostics.get('model')}, frames received "
              f"{diagnostics.get('frames_received')}, processed {diagnostics.get('frames_processed')}, dropped "
              f"{diagnostics.get('frames_dropped')}, rejected {diagnostics.get('frames_rejected')}")
        if not trained:
            print("NOTE: the model weights are an untrained placeholder, so detections are not meaningful yet.")
    bev_path = None
    if bev and best is not None:
        _, stamp, d, g, names = best
        cloud = next(c for _, c in read_clouds(bag) if c.stamp_ns == stamp)
        bev_path = out / "demo_bev.png"
        k = sorted(gt).index(stamp)
        n_matched = results[k].tp
        save_bev_png(bev_path, cloud.points, d.boxes, list(d.class_names), d.scores, (-2.0, 62.0, -32.0, 32.0),
                     f"{sensor} frame {k}: {len(d.boxes)} detections, {len(g.boxes)} ground-truth boxes (dashed), "
                     f"{n_matched} matched" + ("" if trained else " [untrained placeholder weights]"),
                     gt=(g.boxes, names, [False] * len(names)))
        say(f"wrote {bev_path}")
    return DemoResult(results, bev_path, diagnostics, trained)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="out", help="output directory (bag + demo_bev.png)")
    parser.add_argument("--frames", type=int, default=20, help="frames to simulate (10 Hz)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rate", type=float, default=1.0, help="replay speed (1.0 = recorded 10 Hz)")
    from livox_infer.params import add_cli_options

    add_cli_options(parser, ("sensor", "model", "weights", "device", "compile"), model=None, compile=False,
                    helps={"model": "model config (default: the preset's)",
                           "compile": "torch.compile the network (slow start on CPU; default eager)"})
    parser.add_argument("--use-compile", dest="compile", action="store_true", help="the same as --compile")


def main(args: argparse.Namespace | None = None) -> int:
    if args is None:
        parser = argparse.ArgumentParser(prog="python -m livox_infer.tools.demo", description=__doc__.splitlines()[0])
        add_arguments(parser)
        args = parser.parse_args()
    from livox_infer.errors import LivoxInferError

    try:
        run_demo(args.out, sensor=args.sensor, frames=args.frames, seed=args.seed, rate=args.rate,
                 device=args.device, use_compile=args.compile, model=args.model, weights=args.weights)
    except (LivoxInferError, RuntimeError, OSError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
