"""Ctrl-C on the node program, as `ros2 launch` delivers it (issue 30): the terminal's SIGINT and launch's own
both arrive, at any moment (while modules load, while the pipeline builds, while running). Each ends without a
traceback and without a death by signal (launch: "process has died, exit code -2")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("rclpy")
pytestmark = pytest.mark.ros

PROGRAM = "import sys; from livox_infer.ros.entry import main; sys.exit(main())"  # resource/detector_node's


def _start(*ros_args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", PROGRAM, "--ros-args", "-p", "device:=cpu", "-p",
                             "use_compile:=false", *ros_args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)


def _interrupt(proc: subprocess.Popen, times: int) -> tuple[int, str]:
    for _ in range(times):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.03)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


@pytest.mark.slow  # imports rclpy and torch in a subprocess: ~5-10 s
def test_two_sigints_while_running_end_cleanly():
    proc = _start()
    lines = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "detecting on" in line or not line:
            break
    assert "detecting on" in lines[-1], "".join(lines)
    time.sleep(1.0)  # spinning
    rc, out = _interrupt(proc, 2)
    assert rc == 0, "".join(lines) + out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out


def test_sigint_while_the_modules_load_is_one_line():
    proc = _start()
    time.sleep(0.5)  # python is importing rclpy / numpy / the node
    rc, out = _interrupt(proc, 1)
    assert rc == 130, out
    assert out.strip().splitlines()[-1] == "[livox_detector] interrupted during start-up", out
    assert "Traceback" not in out, out


def test_a_start_up_error_caused_by_the_interrupt_is_not_a_fatal_line(capsys):
    """SIGINT reaches the inductor's compiler subprocess too (one process group): its failure is the interrupt's."""
    import rclpy

    from livox_infer.ros.node import spin_node

    def compile_killed():
        rclpy.shutdown()  # what rclpy's SIGINT handler does
        raise RuntimeError("C++ compile error: g++ terminated by signal SIGINT")

    assert spin_node(["livox-infer-run"], compile_killed) == 130
    err = capsys.readouterr().err
    assert "interrupted during start-up" in err and "FATAL" not in err
