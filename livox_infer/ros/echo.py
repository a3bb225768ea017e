"""``livox-infer echo``: print the detector node's detections, one block per frame, without RViz.

    livox-infer echo                                   # /livox_detector/detections until Ctrl-C
    livox-infer echo --topic /my_detector/detections --count 5

Each frame: its stamp, frame_id and number of boxes, then one line per box (class, score, centre, size, yaw),
decoded with the same code that reads detections from bags (bag.detections_from_message)."""

from __future__ import annotations

import argparse
import sys
import time

from livox_infer.ros.node import NODE_NAME

DEFAULT_TOPIC = f"/{NODE_NAME}/detections"


def format_frame(msg) -> str:
    """A Detection3DArray as text: a header line, then one line per detection."""
    from livox_infer import CLASS_NAMES
    from livox_infer.bags import detections_from_message
    from livox_infer.errors import LivoxInferError
    from livox_infer.ros.messages import stamp_to_ns

    head = f"{stamp_to_ns(msg.header.stamp) / 1e9:.3f} s  {msg.header.frame_id or '(no frame_id)'}"
    try:
        frame = detections_from_message(msg)
    except LivoxInferError as exc:  # another detector's classes: say so instead of failing
        return f"{head}  {len(msg.detections)} detections (not livox_infer's: {exc})"
    lines = [f"{head}  {len(frame.labels)} detections"]
    for label, score, box in zip(frame.labels, frame.scores, frame.boxes):
        x, y, z, length, width, height, yaw = (float(v) for v in box)
        lines.append(f"  {CLASS_NAMES[int(label)]:<10} {float(score):5.2f}  xyz {x:7.2f} {y:7.2f} {z:6.2f}  "
                     f"lwh {length:5.2f} {width:5.2f} {height:5.2f}  yaw {yaw:+5.2f}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", default=DEFAULT_TOPIC, help=f"Detection3DArray topic (default {DEFAULT_TOPIC})")
    parser.add_argument("--count", type=int, default=0, help="exit after this many frames (default 0: until Ctrl-C)")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="exit with status 1 when no frame came within this many seconds (default 0: wait)")


def main(args: argparse.Namespace) -> int:
    import rclpy
    from vision_msgs.msg import Detection3DArray

    from livox_infer.ros.replay import init_rclpy

    init_rclpy()  # no rclpy signal handler: Ctrl-C is a KeyboardInterrupt that ends the loop below
    node = rclpy.create_node("livox_infer_echo")
    frames = 0

    def on_detections(msg) -> None:
        nonlocal frames
        frames += 1
        print(format_frame(msg), flush=True)

    node.create_subscription(Detection3DArray, args.topic, on_detections, 10)
    print(f"echoing {args.topic} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    started = time.monotonic()
    warned = False
    try:
        while not args.count or frames < args.count:
            rclpy.spin_once(node, timeout_sec=0.2)
            waited = time.monotonic() - started
            if not frames and args.timeout and waited > args.timeout:
                print(f"livox-infer echo: no detections on {args.topic} within {args.timeout:g} s", file=sys.stderr)
                return 1
            if not frames and not warned and waited > 5.0 and node.count_publishers(args.topic) == 0:
                print(f"livox-infer echo: nothing publishes {args.topic} yet (is the node running, under another "
                      f"name? `ros2 topic list` shows its topics)", file=sys.stderr, flush=True)
                warned = True
    except KeyboardInterrupt:
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0
