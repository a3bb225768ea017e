"""The upstream ROS 2 tools (ros2 launch / param / topic, sensor_msgs_py) for the tests that run what a ROS 2 user
types. scripts/setup_ros_upstream.sh installs them from ../shared/ros2_upstream into their own prefix
(<venv>/ros2_upstream, or $LIVOX_INFER_ROS_UPSTREAM) and writes <prefix>/setup.sh; the tests run every command in
the environment that file gives, with their own ROS domain, kept on this machine."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = REPO.parent / "shared" / "ros2_upstream"
PREFIX = Path(os.environ.get("LIVOX_INFER_ROS_UPSTREAM") or Path(sys.prefix) / "ros2_upstream")
_domains = itertools.count()


def skip_reason() -> str | None:
    """Why the upstream-tool tests cannot run here, or None."""
    if (PREFIX / "setup.sh").is_file():
        return None
    if not SOURCES.is_dir():
        return f"{SOURCES} is absent: the upstream ROS 2 tools (ros2 launch/param/topic) cannot be installed"
    return (f"the upstream ROS 2 tools are not installed in {PREFIX}: run scripts/setup_ros_upstream.sh "
            "(make setup does when ../shared/ros2_upstream exists)")


@lru_cache(maxsize=1)
def _sourced_environment() -> tuple[tuple[str, str], ...]:
    out = subprocess.run(["bash", "-c", f"source '{PREFIX}/setup.sh' && env -0"], check=True,
                         capture_output=True, timeout=30).stdout.decode()
    return tuple(tuple(item.split("=", 1)) for item in out.split("\0") if "=" in item)


def unique_domain_id() -> str:
    """A ROS domain for one test: other test processes on the machine use other domains (pid based)."""
    return str(1 + (os.getpid() * 7 + next(_domains)) % 100)


def ros_env(domain_id: str | None = None) -> dict[str, str]:
    """os.environ + <prefix>/setup.sh, this checkout first on PYTHONPATH, a private ROS domain on localhost."""
    env = dict(_sourced_environment())
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["ROS_DOMAIN_ID"] = domain_id or unique_domain_id()
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env["PYTHONUNBUFFERED"] = "1"
    env["RCUTILS_COLORIZED_OUTPUT"] = "0"
    return env


def run(args: list[str], env: dict[str, str], timeout: float = 60.0, **kwargs) -> subprocess.CompletedProcess:
    """Run a command to completion (bounded); stdout and stderr as text."""
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO, **kwargs)


class Background:
    """A command in its own process group, its output in a file; ``stop()`` ends it with Ctrl-C (SIGINT),
    then SIGKILL for the whole group if it does not end in time."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._file = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=self._file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return True
            if self.proc.poll() is not None:
                return text in self.output()
            time.sleep(0.2)
        return False

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGINT (a user's Ctrl-C) to the process, its exit status; None when it had to be killed."""
        rc = self.proc.poll()
        if rc is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                rc = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever the command left behind (launched nodes)
        except ProcessLookupError:
            pass
        if rc is None:
            self.proc.wait(timeout=10)
        self._file.close()
        return rc


def upstream_type_hashes(package: str) -> dict[str, str]:
    """RIHS01 hash of each message of the upstream ``package``, from its own build (setup_ros_upstream.sh)."""
    out = {}
    for f in sorted((PREFIX / "share" / "upstream_type_hashes" / package).glob("*.json")):
        hashes = json.loads(f.read_text())["type_hashes"]
        out[f.stem] = next(h["hash_string"] for h in hashes if h["type_name"] == f"{package}/msg/{f.stem}")
    return out
