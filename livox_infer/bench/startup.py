"""``livox-infer bench startup``: node start to first detection, inductor cache cold and warm.

Each run starts ``livox-infer run`` (the node, a fresh process) with one TORCHINDUCTOR_CACHE_DIR,
publishes a simulated Avia cloud every 100 ms and times spawn -> first ``~/detections`` message. With
no ``--cache-dir`` the runs share a new empty directory, so the first run is cold and the next ones
warm. The node's own start-up line (weights, compile, cache hits / misses) is shown beside it.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from livox_infer.bench.table import format_table
from livox_infer.params import add_cli_options, parse_bool
from livox_infer.threads import add_threads_argument

STARTUP_RE = re.compile(r"pipeline ready after [\d.]+ s \((.*)\)$", re.MULTILINE)  # the node's one ready line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=2, help="node starts, one after the other (default 2: cold, warm)")
    p.add_argument("--cache-dir", default=None, help="inductor cache to use (default: a new empty one)")
    add_cli_options(p, ("sensor", "compile"))
    # the node parameter's spelling, kept for the commands in the docs
    p.add_argument("--use-compile", dest="compile", type=parse_bool, metavar="{true,false}",
                   help="the same as --compile / --no-compile")
    p.add_argument("--aoti-package", default=None, help="start from this AOTInductor package instead")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the first detection per run")
    add_threads_argument(p)


def _node_command(args: argparse.Namespace, topic: str, name: str) -> list[str]:
    cmd = [sys.executable, "-m", "livox_infer.tools.cli", "run", "--sensor", args.sensor, "--device", "cpu",
           "--compile" if args.compile else "--no-compile", "--input-topic", topic, "--node-name", name,
           "--threads", str(args.threads)]
    if args.aoti_package:
        cmd += ["--ros-args", "-p", f"aoti_package:={os.path.abspath(args.aoti_package)}"]
    return cmd


def time_one_start(args: argparse.Namespace, cache_dir: str, run: int, cloud) -> tuple[float | None, str]:
    """(seconds from spawn to the first detections message or None on timeout, the node's start-up line)."""
    import rclpy
    from sensor_msgs.msg import PointCloud2
    from vision_msgs.msg import Detection3DArray

    name = f"livox_startup_{os.getpid()}_{run}"
    topic = f"/{name}/points"
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, PYTHONUNBUFFERED="1", RCUTILS_LOGGING_BUFFERED_STREAM="0")
    node = rclpy.create_node(f"{name}_client")
    first = threading.Event()
    node.create_subscription(Detection3DArray, f"/{name}/detections", lambda _msg: first.set(), 10)
    pub = node.create_publisher(PointCloud2, topic, 10)
    lines: list[str] = []
    t0 = time.monotonic()
    proc = subprocess.Popen(_node_command(args, topic, name), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    elapsed = None
    try:
        while time.monotonic() - t0 < args.timeout and proc.poll() is None:
            pub.publish(cloud)
            rclpy.spin_once(node, timeout_sec=0.1)
            if first.is_set():
                elapsed = time.monotonic() - t0
                break
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=5)
        node.destroy_node()
    match = STARTUP_RE.search("".join(lines))
    if match is None and elapsed is None:
        tail = "".join(lines).strip().splitlines()[-1:] or ["no output"]
        return None, f"node failed: {tail[0]}"
    return elapsed, match.group(1) if match else "?"


def main(args: argparse.Namespace) -> int:
    import rclpy
    from sensor_msgs.msg import PointCloud2

    from livox_infer.bench.pipeline import make_messages
    from livox_infer.decode.pointcloud import to_ros_message

    msgs, _, n_points = make_messages(args.sensor, 1, 0)
    cloud = to_ros_message(msgs[0], PointCloud2)
    scratch = None if args.cache_dir else tempfile.TemporaryDirectory(prefix="livox_inductor_")
    cache_dir = args.cache_dir or scratch.name
    rclpy.init()
    rows = []
    try:
        for run in range(args.runs):
            elapsed, startup = time_one_start(args, cache_dir, run, cloud)
            rows.append([run + 1, "aoti" if args.aoti_package else ("compiled" if args.compile else "eager"),
                         f"{elapsed:.1f}" if elapsed is not None else "timeout", startup])
    finally:
        rclpy.try_shutdown()
        if scratch is not None:
            scratch.cleanup()
    print(f"node start -> first detection: `livox-infer run --sensor {args.sensor} --device cpu --threads {args.threads}`, "
          f"{n_points}-point clouds at 10 Hz; inductor cache {args.cache_dir or 'new, empty'}; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}")
    print(format_table(["run", "network", "first detection s", "node start-up phases"], rows))
    return 0 if all(r[2] != "timeout" for r in rows) else 1
