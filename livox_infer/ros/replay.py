"""Publish a rosbag2's clouds (and ground truth) into ROS 2 with their recorded timing.

No rosbag2 install needed: the pure-Python ``rosbags`` reader yields each message's serialized
CDR, and rclpy publishes those bytes as they are (``Publisher.publish(bytes)``), so nothing is
deserialized on the way. sqlite3 and mcap bags both work.

    livox-infer replay BAG [--rate 2.0] [--loop] [--remap /livox/lidar:=/points]
    livox-infer replay BAG --soak 2        # soak benchmark: node subprocess + replay, RSS / drops / latency

Python API: :class:`BagReplayer` (tests, demo) and :func:`replay_topics`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from livox_infer.bags import one_line
from livox_infer.errors import ConfigError, LivoxInferError
from livox_infer.threads import add_threads_argument

POINTCLOUD2 = "sensor_msgs/msg/PointCloud2"
DETECTION3D_ARRAY = "vision_msgs/msg/Detection3DArray"
CUSTOM_MSG_TYPES = ("livox_ros_driver2/msg/CustomMsg", "livox_ros_driver/msg/CustomMsg",
                    "livox_interfaces/msg/CustomMsg")
REPLAYED_TYPES = (POINTCLOUD2, DETECTION3D_ARRAY, *CUSTOM_MSG_TYPES)
ACK_TIMEOUT_S = 3.0  # at the end of a replay: how long reliable subscribers may take to acknowledge the last messages


def _poll(condition: Callable[[], bool], timeout_s: float) -> bool:
    """True once ``condition()`` holds (checked every 20 ms), False after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class BagError(LivoxInferError, ValueError):
    """The bag cannot be opened or holds nothing that can be replayed."""


@dataclass
class ReplayStats:
    published: dict[str, int] = field(default_factory=dict)  # output topic -> messages
    skipped_topics: dict[str, str] = field(default_factory=dict)  # bag topic -> why it is not replayed
    corrupt: dict[str, int] = field(default_factory=dict)  # bag topic -> messages not published (undecodable)
    loops: int = 0
    wall_s: float = 0.0
    max_lag_ms: float = 0.0  # worst delay behind the scaled recorded schedule


def message_check(msgtype: str) -> Callable[[bytes], None]:
    """A function that raises for a serialized message of ``msgtype`` that no subscriber could use: CDR that
    does not deserialize, a PointCloud2 whose geometry is impossible (negative, point_step 0, width * point_step
    beyond row_step, big-endian) or whose data length is not row_step * height, a truncated CustomMsg.
    (Which fields a cloud has is the subscriber's business.) Corrupt messages are counted and not published."""
    from livox_infer.decode.custom_msg import decode_custom_msg_cdr
    from livox_infer.bags import typestore
    from livox_infer.bags import pointcloud2_from_cdr

    def check_cloud(raw: bytes) -> None:
        from livox_infer.decode.pointcloud import check_geometry

        msg = pointcloud2_from_cdr(raw)
        check_geometry(msg)  # width * point_step must fit in row_step (width 1e9 in 18 bytes was forwarded)
        if len(msg.data) != int(msg.row_step) * int(msg.height):
            raise ValueError(f"PointCloud2 data has {len(msg.data)} bytes, row_step * height = "
                             f"{int(msg.row_step) * int(msg.height)}")

    if msgtype == POINTCLOUD2:
        return check_cloud
    if msgtype in CUSTOM_MSG_TYPES:
        return decode_custom_msg_cdr
    store = typestore()
    return lambda raw: store.deserialize_cdr(raw, msgtype)


def parse_remaps(items: Iterable[str]) -> dict[str, str]:
    """``["/a:=/b", ...]`` → ``{"/a": "/b"}``."""
    out: dict[str, str] = {}
    for item in items:
        src, sep, dst = item.partition(":=")
        if not sep or not src or not dst:
            raise ConfigError(f"remap must look like /from:=/to, got {item!r}")
        out[src] = dst
    return out


def message_class(msgtype: str):
    """rclpy class for ``pkg/msg/Name``, or None when that interface package is not installed."""
    pkg, _, name = msgtype.split("/")
    try:
        return getattr(importlib.import_module(f"{pkg}.msg"), name)
    except (ImportError, AttributeError):
        return None


def _open_reader(path: Path):
    from rosbags.rosbag2 import Reader

    if not path.exists():
        raise BagError(f"bag not found: {path}")
    try:
        reader = Reader(path)
        reader.open()
    except Exception as exc:  # rosbags raises its own error types for broken metadata / storage
        raise BagError(f"cannot open bag {path}: {one_line(exc)}") from None
    return reader


def bag_topics(path: str | os.PathLike) -> dict[str, str]:
    """topic → message type of a rosbag2."""
    reader = _open_reader(Path(path))
    try:
        return {c.topic: c.msgtype for c in reader.connections}
    finally:
        reader.close()


class BagReplayer:
    """Publishes a bag's PointCloud2 / CustomMsg / Detection3DArray topics from ``node``.

    Timing follows the bag's recorded receive times divided by ``rate`` (0 or inf = as fast as
    possible). Topics whose type is not installed (e.g. CustomMsg without livox_ros_driver2)
    are skipped and listed in ``stats.skipped_topics``.
    """

    def __init__(self, node, bag: str | os.PathLike, *, rate: float = 1.0, loop: bool = False,
                 remap: dict[str, str] | None = None, topics: Iterable[str] | None = None,
                 qos_depth: int = 10, on_publish: Callable[[str, int, bytes], None] | None = None) -> None:
        if not rate >= 0:
            raise ConfigError(f"rate must be >= 0, got {rate}")
        self.node = node
        self.bag = Path(bag)
        self.rate = float(rate)
        self.loop = bool(loop)
        self.remap = dict(remap or {})
        self.on_publish = on_publish
        self.stats = ReplayStats()
        wanted = set(topics) if topics is not None else None
        self._publishers: dict[str, Any] = {}
        self._out_topic: dict[str, str] = {}
        self._check: dict[str, Callable[[bytes], None]] = {}
        self._cloud_topics: list[str] = []  # what a detector subscribes to (not the ground truth)
        for topic, msgtype in bag_topics(self.bag).items():
            if wanted is not None and topic not in wanted:
                continue
            if msgtype not in REPLAYED_TYPES:
                self.stats.skipped_topics[topic] = f"type {msgtype} is not replayed"
                continue
            cls = message_class(msgtype)
            if cls is None:
                self.stats.skipped_topics[topic] = f"interface {msgtype} is not installed"
                continue
            out = self.remap.get(topic, topic)
            self._out_topic[topic] = out
            self._publishers[topic] = node.create_publisher(cls, out, qos_depth)
            if msgtype != DETECTION3D_ARRAY:
                self._cloud_topics.append(topic)
            self._check[topic] = message_check(msgtype)
            self.stats.published[out] = 0
        if not self._publishers:
            raise BagError(f"nothing to replay in {self.bag} (skipped: {self.stats.skipped_topics or 'no topics'})")

    @property
    def output_topics(self) -> list[str]:
        return list(self._out_topic.values())

    def _messages(self) -> Iterator[tuple[str, int, bytes]]:
        reader = _open_reader(self.bag)
        try:
            conns = [c for c in reader.connections if c.topic in self._publishers]
            try:
                for conn, t_ns, raw in reader.messages(connections=conns):
                    yield conn.topic, t_ns, raw
            except Exception as exc:  # noqa: BLE001 - a damaged bag (e.g. an mcap chunk checksum mismatch)
                raise BagError(f"cannot read messages from bag {self.bag}: {type(exc).__name__}: {one_line(exc)}") from None
        finally:
            reader.close()

    def wait_for_subscribers(self, topic: str, count: int = 1, timeout_s: float = 10.0) -> bool:
        """Wait until ``count`` subscribers matched the output ``topic`` (DDS discovery takes a moment)."""
        pub = next(p for t, p in self._publishers.items() if self._out_topic[t] == topic)
        return _poll(lambda: pub.get_subscription_count() >= count, timeout_s)

    def wait_for_cloud_subscribers(self, timeout_s: float) -> bool:
        """Wait until every replayed cloud topic has a matched subscriber (the ground truth's do not count), up to
        ``timeout_s``: a message published before DDS discovery matched a subscriber is lost to it."""
        pubs = [self._publishers[t] for t in self._cloud_topics] or list(self._publishers.values())
        return _poll(lambda: all(p.get_subscription_count() > 0 for p in pubs), timeout_s)

    def wait_for_acks(self, timeout_s: float) -> bool:
        """Wait until every matched subscriber acknowledged what was published (reliable QoS), up to
        ``timeout_s`` in all: a replay that exits at once takes unacknowledged messages with it, which a
        subscriber still completing discovery would have fetched a moment later."""
        from rclpy.duration import Duration

        deadline = time.monotonic() + timeout_s
        ok = True
        for pub in self._publishers.values():
            left = max(0.0, deadline - time.monotonic())
            ok = pub.wait_for_all_acked(Duration(nanoseconds=int(left * 1e9))) and ok
        return ok

    def run(self, stop: threading.Event | None = None, max_messages: int | None = None) -> ReplayStats:
        """Publish until the bag ends (or forever with ``loop``, until ``stop`` is set)."""
        stop = stop or threading.Event()
        started = time.monotonic()
        sent = 0
        while not stop.is_set():
            t0_bag = None
            t0_wall = time.monotonic()
            any_sent = False
            for topic, t_ns, raw in self._messages():
                if stop.is_set() or (max_messages is not None and sent >= max_messages):
                    break
                if t0_bag is None:
                    t0_bag = t_ns
                if self.rate > 0 and self.rate != float("inf"):
                    due = t0_wall + (t_ns - t0_bag) * 1e-9 / self.rate
                    delay = due - time.monotonic()
                    if delay > 0:
                        if stop.wait(delay):
                            break
                    else:
                        self.stats.max_lag_ms = max(self.stats.max_lag_ms, -delay * 1e3)
                if not self._intact(topic, raw):
                    continue
                self._publishers[topic].publish(raw)
                out = self._out_topic[topic]
                self.stats.published[out] += 1
                sent += 1
                any_sent = True
                if self.on_publish is not None:
                    self.on_publish(out, t_ns, raw)
            if not self.loop or not any_sent or (max_messages is not None and sent >= max_messages):
                break
            self.stats.loops += 1
        self.stats.wall_s = time.monotonic() - started
        return self.stats


    def _intact(self, topic: str, raw: bytes) -> bool:
        try:
            self._check[topic](raw)
            return True
        except Exception:  # noqa: BLE001 - rosbags raises assorted errors on damaged CDR
            self.stats.corrupt[topic] = self.stats.corrupt.get(topic, 0) + 1
            return False


def init_rclpy() -> None:
    """rclpy.init for the replay commands.

    Our own command line is not handed to rcl: it reads ``--remap /a:=/b`` as an old-style remap rule and warns
    that the syntax is deprecated. No rclpy signal handlers: with them, Ctrl-C invalidates the context under the
    publish loop ("RCLError: publisher's context is invalid"); without, it is a KeyboardInterrupt we end on."""
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    rclpy.init(args=[sys.argv[0] if sys.argv else "livox-infer"], signal_handler_options=SignalHandlerOptions.NO)


def replay_topics(bag: str | os.PathLike, **kwargs: Any) -> ReplayStats:
    """Initialise rclpy, replay ``bag`` once (or looped until Ctrl-C), shut down. kwargs: BagReplayer's."""
    import rclpy

    init_rclpy()
    node = rclpy.create_node("livox_replay")
    try:
        replayer = BagReplayer(node, bag, **kwargs)
        return replayer.run()
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


# ---------------------------------------------------------------------- soak benchmark
def cdr_header_stamp_ns(raw: bytes) -> int:
    """Header stamp of a serialized message that starts with std_msgs/Header (little-endian CDR)."""
    sec, nanosec = struct.unpack_from("<iI", raw, 4)
    return sec * 1_000_000_000 + nanosec


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def run_soak(bag: str | None, *, minutes: float, rate: float = 1.0, sensor: str = "avia", device: str = "cpu",
             use_compile: str = "false", remap: dict[str, str] | None = None, sample_s: float = 10.0,
             threads: int | None = None) -> int:
    """Start the node as a subprocess (``livox-infer run``), replay ``bag`` looped for ``minutes``, and
    print RSS over time, received/processed/dropped frames and latency percentiles. Not a test."""
    import numpy as np
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from vision_msgs.msg import Detection3DArray

    if not bag:
        print("livox-infer replay --soak: a bag is required (e.g. from `livox-infer simulate`)", file=sys.stderr)
        return 2
    topic = (remap or {}).get("/livox/lidar", "/livox/lidar")
    cmd = [sys.executable, "-m", "livox_infer.tools.cli", "run", "--sensor", sensor, "--device", device,
           "--use-compile", use_compile, "--input-topic", topic]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    node_proc = subprocess.Popen(cmd)
    init_rclpy()
    node = rclpy.create_node("livox_soak")
    sent_at: dict[int, float] = {}  # cloud stamp -> wall time of its latest publish
    latencies_ms: list[float] = []
    last_diag: dict[str, str] = {}

    def on_publish(out_topic: str, _t: int, raw: bytes) -> None:
        if out_topic == topic:
            sent_at[cdr_header_stamp_ns(raw)] = time.monotonic()

    def on_detections(msg) -> None:
        t = sent_at.get(int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec))
        if t is not None:
            latencies_ms.append((time.monotonic() - t) * 1e3)

    def on_diag(msg) -> None:
        for st in msg.status:
            if "livox_infer detector" in st.name:
                last_diag.clear()
                last_diag.update({kv.key: kv.value for kv in st.values})

    node.create_subscription(Detection3DArray, "/livox_detector/detections", on_detections, 10)
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    replayer = BagReplayer(node, bag, rate=rate, loop=True, remap=remap, topics=["/livox/lidar"],
                           on_publish=on_publish)
    stop = threading.Event()
    spin = threading.Thread(target=lambda: _spin_until(node, stop), daemon=True)
    spin.start()
    rows = []
    try:
        if not replayer.wait_for_subscribers(topic, timeout_s=120.0):
            print("the node did not subscribe within 120 s", file=sys.stderr)
            return 1
        play = threading.Thread(target=replayer.run, args=(stop,), daemon=True)
        t0 = time.monotonic()
        play.start()
        print(f"soak: {minutes} min, bag {bag} looped at x{rate}, node pid {node_proc.pid}")
        print(f"{'t_s':>6} {'rss_mb':>8} {'received':>9} {'processed':>9} {'dropped':>8} {'e2e_p50':>8} {'e2e_p99':>8}")
        while time.monotonic() - t0 < minutes * 60.0 and node_proc.poll() is None:
            try:
                stop.wait(sample_s)
            except KeyboardInterrupt:  # Ctrl-C ends the soak early; the summary still prints
                break
            lat = np.asarray(latencies_ms[-200:]) if latencies_ms else np.asarray([np.nan])
            row = (time.monotonic() - t0, _rss_mb(node_proc.pid), last_diag.get("frames_received", "?"),
                   last_diag.get("frames_processed", "?"), last_diag.get("frames_dropped", "?"),
                   float(np.percentile(lat, 50)), float(np.percentile(lat, 99)))
            rows.append(row)
            print(f"{row[0]:6.0f} {row[1]:8.1f} {row[2]:>9} {row[3]:>9} {row[4]:>8} {row[5]:8.1f} {row[6]:8.1f}",
                  flush=True)
    finally:
        stop.set()
        node_proc.send_signal(2)  # SIGINT: the node shuts down cleanly
        try:
            node_proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            node_proc.kill()
        node.destroy_node()
        rclpy.try_shutdown()
    if not rows:
        return 1
    lat = np.asarray(latencies_ms) if latencies_ms else np.asarray([np.nan])
    rss = [r[1] for r in rows]
    print(f"\nclouds published {replayer.stats.published.get(topic, 0)}, detections received {len(latencies_ms)}")
    print(f"RSS first/last/max: {rss[0]:.1f} / {rss[-1]:.1f} / {max(rss):.1f} MB")
    print(f"end-to-end latency ms (publish -> detections): p50 {np.percentile(lat, 50):.1f}  "
          f"p90 {np.percentile(lat, 90):.1f}  p99 {np.percentile(lat, 99):.1f}  max {lat.max():.1f}")
    for key in sorted(k for k in last_diag if k.startswith("latency_") or k.startswith("frames_")):
        print(f"  {key}: {last_diag[key]}")
    return 0


def _spin_until(node, stop: threading.Event) -> None:
    import rclpy

    while not stop.is_set() and rclpy.ok():
        rclpy.spin_once(node, timeout_sec=0.1)


# ---------------------------------------------------------------------- CLI
def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}") from None
    if not (value >= 0.0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", nargs="?", help="rosbag2 directory (sqlite3 or mcap)")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed factor (0 = as fast as possible)")
    parser.add_argument("--loop", action="store_true", help="start over at the end")
    parser.add_argument("--remap", action="append", default=[], metavar="FROM:=TO", help="rename a topic")
    parser.add_argument("--topics", nargs="+", default=None, help="replay only these bag topics")
    parser.add_argument("--wait-for-subscriber", type=_non_negative_seconds, default=5.0, metavar="S",
                        help="before the first message, wait up to S seconds until every replayed cloud topic has a "
                        "subscriber (else the first messages are lost to a node that is still being discovered); "
                        "0 = start at once (default %(default)s)")
    parser.add_argument("--soak", type=float, default=None, metavar="MINUTES",
                        help="soak benchmark: start the node (subprocess), replay looped, report RSS/drops/latency")
    parser.add_argument("--sensor", default="avia", help="soak: sensor preset of the node (default avia)")
    parser.add_argument("--device", default="cpu", help="soak: node device (default cpu)")
    parser.add_argument("--use-compile", default="false", help="soak: node use_compile (default false)")
    add_threads_argument(parser, default=None)  # soak: passed on to the node


def main(args: argparse.Namespace) -> int:
    try:
        remap = parse_remaps(args.remap)
        if args.soak is not None:
            return run_soak(args.bag, minutes=args.soak, rate=args.rate, sensor=args.sensor, device=args.device,
                            use_compile=args.use_compile, remap=remap, threads=args.threads)
        if not args.bag:
            print("livox-infer replay: a bag is required", file=sys.stderr)
            return 2
        import rclpy

        init_rclpy()
        node = rclpy.create_node("livox_replay")
        try:
            replayer = BagReplayer(node, args.bag, rate=args.rate, loop=args.loop, remap=remap, topics=args.topics)
            for topic, why in replayer.stats.skipped_topics.items():
                print(f"skipping {topic}: {why}", file=sys.stderr)
            print(f"replaying {args.bag} -> {', '.join(replayer.output_topics)} at x{args.rate}"
                  + (" (loop, Ctrl-C to stop)" if args.loop else ""), flush=True)
            started = time.monotonic()
            try:
                if args.wait_for_subscriber > 0 and not replayer.wait_for_cloud_subscribers(args.wait_for_subscriber):
                    print(f"a cloud topic has no subscriber after {args.wait_for_subscriber:g} s: replaying anyway",
                          file=sys.stderr)
                stats = replayer.run()
                if not replayer.wait_for_acks(ACK_TIMEOUT_S):
                    print(f"some messages were not acknowledged by their subscribers within {ACK_TIMEOUT_S:g} s",
                          file=sys.stderr)
            except KeyboardInterrupt:  # Ctrl-C ends the replay (a --loop runs until then): a normal end
                stats = replayer.stats
                stats.wall_s = time.monotonic() - started
            for topic, n in stats.published.items():
                print(f"  {topic}: {n} messages")
            print(f"  {stats.wall_s:.1f} s, {stats.loops} loops, worst lag {stats.max_lag_ms:.1f} ms")
            for topic, n in stats.corrupt.items():
                print(f"livox-infer replay: {topic}: {n} corrupt messages skipped", file=sys.stderr)
        finally:
            node.destroy_node()
            rclpy.try_shutdown()
        return 1 if stats.corrupt else 0
    except LivoxInferError as exc:
        print(f"livox-infer replay: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the replay started
        return 130


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m livox_infer.ros.replay")
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
