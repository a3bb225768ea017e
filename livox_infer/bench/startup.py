"""``livox-infer bench startup``: node start to first detection on a new machine, a restart, torch.compile cold and
warm, an exported AOTInductor package, eager.

Each row starts ``livox-infer run --sensor S`` (the node, a fresh process), publishes a simulated cloud of that
sensor every 100 ms and times spawn -> first ``~/detections`` message; the node's own ready line (phases, inductor
cache hits / misses, which network runs and why) is shown beside it. Each kind of start has its own livox_infer cache
folder under ``--cache-dir`` (default a new empty one), so the first of its rows starts from nothing:

- ``new``: the node's defaults on a machine without a package (an empty cache folder): eager at once while the package
  is built in the background (``build_package``); the row also times spawn -> the node's "network now ... (aoti)" line
  (the "compiled in use" column);
- ``restart``: the same folder again: a later start, which loads the package ``new`` built;
- ``cold`` / ``warm``: ``build_package:=false``, so torch.compile in the node, with an empty inductor cache and then
  with the one ``cold`` left: eager at once while a thread compiles (or loads what ``cold`` saved), the "compiled in
  use" column timing the node's "network now ... (compiled)" line (``compile_in_background``, the default); add
  ``--compile-first`` for ``compile_in_background:=false``, compiled before the first detection;
- ``package``: ``livox-infer export --install --sensor S`` into its folder first (timed, once per machine, as
  ``make setup`` does), then the node finds the package by itself; ``--aoti-package`` names one instead;
- ``eager``: ``--use-compile false``.
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
from pathlib import Path

from livox_infer.bench.table import format_table
from livox_infer.params import add_cli_options, parse_bool
from livox_infer.threads import add_threads_argument

STARTUP_RE = re.compile(r"pipeline ready after [\d.]+ s \((.*)\)$", re.MULTILINE)  # the node's one ready line
MODES = ("new", "restart", "cold", "warm", "package", "eager")
SWITCH_RE = re.compile(r"network now \S+ \((aoti|compiled)[,)]|no AOTInductor package from the background build|"
                       r"torch.compile in the background failed")  # node.py, pipeline.py


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default=",".join(MODES), help="comma list of %(default)s (in this order)")
    p.add_argument("--runs", type=int, default=1, help="starts per mode (default 1; new and cold are always one)")
    p.add_argument("--cache-dir", default=None,
                   help="folder for the rows' livox_infer cache folders (default: a new empty one, removed afterwards)")
    add_cli_options(p, ("sensor", "compile"))
    # the node parameter's spelling, kept for the commands in the docs
    p.add_argument("--use-compile", dest="compile", type=parse_bool, metavar="{true,false}",
                   help="false: only the eager row (the same as --no-compile)")
    p.add_argument("--aoti-package", default=None, help="time this AOTInductor package instead of exporting one")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the first detection per run")
    p.add_argument("--compile-first", action="store_true",
                   help="cold / warm rows with compile_in_background:=false: torch.compile before the first detection")
    add_threads_argument(p)


def _node_command(args: argparse.Namespace, topic: str, name: str, compile_: bool, params: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "livox_infer.tools.cli", "run", "--sensor", args.sensor, "--device", "cpu",
           "--compile" if compile_ else "--no-compile", "--input-topic", topic, "--node-name", name,
           "--threads", str(args.threads)]
    if params:
        cmd += ["--ros-args", *[a for p in params for a in ("-p", p)]]
    return cmd


def _env(folder: Path, own_manifest: bool) -> dict[str, str]:
    """The environment of one kind of start: its own livox_infer cache folder (inductor's cache and the packages in
    it); the trusted-package manifest there too unless the user named a package (the user's stays untouched)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", RCUTILS_LOGGING_BUFFERED_STREAM="0",
               TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor"), LIVOX_INFER_CACHE_DIR=str(folder))
    if own_manifest:
        env["LIVOX_INFER_AOTI_MANIFEST"] = str(folder / "aoti_manifest.json")
    return env


def time_one_start(args: argparse.Namespace, env: dict[str, str], run: str, cloud, compile_: bool = True,
                   params: list[str] | None = None, wait_for_package: bool = False
                   ) -> tuple[float | None, float | None, str]:
    """(seconds from spawn to the first detections message or None on timeout, with ``wait_for_package`` seconds to
    the node's line that the package built or the network compiled in the background runs (None: not within the
    timeout), the node's start-up line)."""
    import rclpy
    from sensor_msgs.msg import PointCloud2
    from vision_msgs.msg import Detection3DArray

    name = f"livox_startup_{os.getpid()}_{run}"
    topic = f"/{name}/points"
    node = rclpy.create_node(f"{name}_client")
    first = threading.Event()
    node.create_subscription(Detection3DArray, f"/{name}/detections", lambda _msg: first.set(), 10)
    pub = node.create_publisher(PointCloud2, topic, 10)
    lines: list[str] = []
    t0 = time.monotonic()
    proc = subprocess.Popen(_node_command(args, topic, name, compile_, params or []), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    elapsed = switched = None
    try:
        while time.monotonic() - t0 < args.timeout and proc.poll() is None:
            pub.publish(cloud)
            rclpy.spin_once(node, timeout_sec=0.1)
            if first.is_set() and elapsed is None:
                elapsed = time.monotonic() - t0
            if elapsed is not None and wait_for_package and SWITCH_RE.search("".join(lines)):
                switched = time.monotonic() - t0
            if elapsed is not None and (not wait_for_package or switched is not None):
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
    text = "".join(lines)
    match = STARTUP_RE.search(text)
    if match is None and elapsed is None:
        tail = text.strip().splitlines()[-1:] or ["no output"]
        return None, None, f"node failed: {tail[0]}"
    said = match.group(1) if match else "?"
    failed = re.search(r"no AOTInductor package from the background build \((.*)\)", text)
    if failed:
        switched, said = None, f"{said}; background build failed: {failed.group(1)}"
    failed = re.search(r"torch.compile in the background failed.*", text)
    if failed:
        switched, said = None, f"{said}; {failed.group(0)}"
    switch = re.search(r"network now \S+ \(compiled[^)]*\): (.*)$", text, re.MULTILINE)
    if switch:  # what the thread compiled or loaded
        said = f"{said}; {switch.group(1)}"
    return elapsed, switched, said


def export_package(args: argparse.Namespace, env: dict[str, str]) -> tuple[float, str]:
    """`livox-infer export --install --sensor S` into the row's cache folder: (seconds, what it printed last)."""
    cmd = [sys.executable, "-m", "livox_infer.tools.cli", "export", "--model", "lite", "--sensor", args.sensor,
           "--install", "--threads", str(args.threads)]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"export failed: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    return time.monotonic() - t0, out.stdout.strip().splitlines()[-1]


def main(args: argparse.Namespace) -> int:
    import rclpy
    from sensor_msgs.msg import PointCloud2

    from livox_infer.bench.pipeline import make_messages
    from livox_infer.decode.pointcloud import to_ros_message

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        print(f"livox-infer bench startup: unknown modes {bad}; use {', '.join(MODES)}", file=sys.stderr)
        return 2
    if args.compile is False:
        modes = [m for m in modes if m == "eager"] or ["eager"]
    msgs, _, n_points = make_messages(args.sensor, 1, 0)
    cloud = to_ros_message(msgs[0], PointCloud2)
    scratch = None if args.cache_dir else tempfile.TemporaryDirectory(prefix="livox_startup_")
    root = Path(args.cache_dir or scratch.name)
    load_before = os.getloadavg()[0]
    notes = []
    rclpy.init()
    rows = []
    try:
        for mode in modes:
            package = args.aoti_package if mode == "package" else None
            family = {"restart": "new", "warm": "cold"}.get(mode, mode)  # a second start reuses the first one's folder
            env = _env(root / family, own_manifest=not package)
            params = [f"aoti_package:={os.path.abspath(package)}"] if package else []
            # rows whose node switches networks after its first detection: the "compiled in use" column
            timed_switch = mode == "new" or (mode in ("cold", "warm") and not args.compile_first)
            if mode in ("cold", "warm"):
                params.append("build_package:=false")
                if args.compile_first:
                    params.append("compile_in_background:=false")
            if mode == "package" and not package:
                try:
                    seconds, said = export_package(args, env)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"livox-infer bench startup: {exc}", file=sys.stderr)
                    return 1
                notes.append(f"package built first in {seconds:.1f} s (`livox-infer export --model lite --sensor "
                             f"{args.sensor} --install --threads {args.threads}`: {said.split(';')[0]})")
            for run in range(1 if mode in ("new", "cold") else args.runs):
                elapsed, switched, startup = time_one_start(args, env, f"{mode}{run}", cloud,
                                                            compile_=(mode != "eager"), params=params,
                                                            wait_for_package=timed_switch)
                rows.append([mode, run + 1, f"{elapsed:.1f}" if elapsed is not None else "timeout",
                             "" if not timed_switch else f"{switched:.1f}" if switched is not None else "-", startup])
    finally:
        rclpy.try_shutdown()
        if scratch is not None:
            scratch.cleanup()
    print(f"node start -> first detection: `livox-infer run --sensor {args.sensor} --device cpu --threads {args.threads}`, "
          f"{n_points}-point clouds at 10 Hz; livox_infer cache {args.cache_dir or 'new, empty'}; {os.cpu_count()} "
          f"cores, load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    for note in notes:
        print(note)
    print(format_table(["start", "run", "first detection s", "compiled in use s", "node start-up phases (its ready line)"],
                       rows))
    return 0 if all(r[2] != "timeout" and r[3] != "-" for r in rows) else 1
