"""The README's export -> run chain, live: `livox-infer export ... --sensor avia` exactly as README.md writes it, then
`livox-infer run --sensor avia --ros-args -p aoti_package:=$PWD/...` as README.md writes it, a real node process on
loopback that must publish detections for simulated Avia clouds from the package (issue 30: the package of
`export --model lite` was refused by the Avia preset, whose 80 m grid differs, as "another architecture").
A package for one grid run on another is refused with the grid named."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")

pytestmark = [pytest.mark.slow, pytest.mark.ros]  # one AOTInductor export of lite (~20-60 s) + one node start

REPO = Path(__file__).resolve().parent.parent


def readme_line(pattern: str) -> list[str]:
    """The README command (without its comment) that matches ``pattern``, split into words after `livox-infer`."""
    for line in (REPO / "README.md").read_text().splitlines():
        if re.search(pattern, line):
            words = shlex.split(line.split("#")[0])
            assert words[0] == "livox-infer", line
            return words[1:]
    raise AssertionError(f"README.md has no line matching {pattern!r}")


def test_readme_export_then_run_with_the_avia_preset(tmp_path, monkeypatch):
    import rclpy
    from sensor_msgs.msg import PointCloud2
    from vision_msgs.msg import Detection3DArray

    from livox_infer.bench.pipeline import make_messages
    from livox_infer.decode.pointcloud import to_ros_message

    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               RCUTILS_LOGGING_BUFFERED_STREAM="0", LIVOX_INFER_AOTI_MANIFEST=str(tmp_path / "manifest.json"))
    export = readme_line(r"^livox-infer export .*--sensor avia")
    out = subprocess.run([sys.executable, "-m", "livox_infer.tools.cli", *export], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "grid x 0..80 m, y -41.6..41.6 m" in out.stdout and "max_abs_diff" in out.stdout, out.stdout

    run = [w.replace("$PWD", str(tmp_path)) for w in readme_line(r"^livox-infer run .*aoti_package:=")]
    package = Path(next(w for w in run if w.startswith("aoti_package:=")).split(":=", 1)[1])
    assert package.is_file(), f"the README's run line names {package}, which its export line did not write"
    name = f"readme_chain_{os.getpid()}"
    at = run.index("--ros-args")
    cmd = [sys.executable, "-m", "livox_infer.tools.cli", *run[:at], "--input-topic", f"/{name}/points",
           "--node-name", name, *run[at:]]

    msgs, _, _ = make_messages("avia", 1, 0)
    cloud = to_ros_message(msgs[0], PointCloud2)
    rclpy.init()
    node = rclpy.create_node(f"{name}_client")
    got = []
    node.create_subscription(Detection3DArray, f"/{name}/detections", got.append, 10)
    pub = node.create_publisher(PointCloud2, f"/{name}/points", 10)
    lines: list[str] = []
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 240 and proc.poll() is None and len(got) < 3:
            pub.publish(cloud)
            rclpy.spin_once(node, timeout_sec=0.1)
        alive = proc.poll() is None
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
        rclpy.try_shutdown()
    log = "".join(lines)
    assert alive and len(got) >= 3, log[-3000:]
    assert re.search(r"pipeline ready after [\d.]+ s \(aoti package [\d.]+ s\)", log), log[-3000:]
    assert sum(len(m.detections) for m in got) > 0, "the package gave no box on a simulated Avia drive"

    # the same package on the model's own grid: refused, and the message says the grid differs
    from livox_infer.errors import WeightsError
    from livox_infer.pipeline import DetectionPipeline

    monkeypatch.setenv("LIVOX_INFER_AOTI_MANIFEST", env["LIVOX_INFER_AOTI_MANIFEST"])
    with pytest.raises(WeightsError, match=r"grid bev_extent \[0,80,-41.6,41.6\] and the pipeline's grid is "
                                           r"\[0,80,-28.8,28.8\]"):
        DetectionPipeline("lite", device="cpu", aoti_package=package)
