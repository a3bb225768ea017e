"""The AOTInductor package built in the background, so a node is never blind while it compiles (issue 33).

When the node starts on a CPU with ``use_compile`` and no package matches (a new machine, new weights, another grid
or thread count), torch.compile in the node would keep it from detecting for ~10 s (warm inductor cache) to ~45 s
(cold). With ``build_package`` the pipeline instead detects eagerly at once and starts ``livox-infer export
--install --if-missing`` as a child process at the lowest CPU priority; between two frames it switches to the package
once that is built, and every later start on this machine loads it (~2 s, docs/performance.md). The child:

- runs at nice 19, so on a busy robot the node's frames come first;
- dies with the process that started it (Linux ``PR_SET_PDEATHSIG``): a node that stops leaves no compiler behind,
  and the next start begins the build again;
- takes a lock file beside the package, so two nodes needing the same package build it once (the second waits for
  the first one's package);
- writes its output to ``<package>.build.log`` in the packages folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LOCKED_EXIT = 3  # the export child's exit status when another process holds the package's build lock
_PR_SET_PDEATHSIG = 1


def lock_path(package: Path) -> Path:
    return package.with_suffix(".lock")


def log_path(package: Path) -> Path:
    return package.with_suffix(".build.log")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's process: alive
        return True
    return True


def _lock_owner(lock: Path) -> int | None:
    """The pid in a lock file whose process still runs, else None."""
    try:
        pid = int(lock.read_text(encoding="utf-8").strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and _pid_alive(pid) else None


def take_lock(package: Path) -> bool:
    """Create the package's build lock for this process (True), or False while another live process holds it. A
    lock left by a process that died is taken over."""
    lock = lock_path(package)
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _lock_owner(lock) is not None:
                return False
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()  # stale: its builder died
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
        return True
    return False


def release_lock(package: Path) -> None:
    lock = lock_path(package)
    with contextlib.suppress(OSError, ValueError):
        if int(lock.read_text(encoding="utf-8").strip() or 0) == os.getpid():
            lock.unlink()


def become_background_of(parent_pid: int) -> bool:
    """In the export child: lowest CPU priority, and SIGTERM when ``parent_pid`` (the process that started it) ends.
    False when that process has ended already."""
    with contextlib.suppress(OSError):
        os.nice(19)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    return os.getppid() == parent_pid  # re-parented already: the starter died before prctl took effect


class PackageBuild:
    """One background export of ``package`` (the path `find_package` looks for). `poll` says how it stands."""

    def __init__(self, command: list[str], package: Path, env: dict[str, str] | None = None) -> None:
        self.package = package
        self.log_path = log_path(package)
        self.started = time.monotonic()
        self.waiting_for_other = False  # another process holds the lock: wait for its package
        package.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w", encoding="utf-8") as out:
            self.proc: subprocess.Popen | None = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def poll(self) -> str | None:
        """None while it builds; "" when the package is there; otherwise why there is none."""
        if self.proc is not None:
            code = self.proc.poll()
            if code is None:
                return None
            self.proc = None
            if code == LOCKED_EXIT:
                self.waiting_for_other = True
            elif code != 0:
                return f"the export exited with status {code}: {self._last_line()}"
        if self.package.is_file() and self.package.with_suffix(".json").is_file():
            return ""
        if self.waiting_for_other and _lock_owner(lock_path(self.package)) is not None:
            return None
        return f"no package at {self.package} after the export ({self._last_line()})"

    def stop(self) -> None:
        """End the child now (the pipeline was rebuilt with other settings, or is closing)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _last_line(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return lines[-1] if lines else "no output"


def export_command(model_source: str, weights: Path, threads: int, extent: tuple[float, ...] | None,
                   flip: bool, precision: str = "fp32") -> list[str]:
    """`livox-infer export --install --if-missing` of exactly this model, grid, weights and thread count, run as a
    background child of this process."""
    cmd = [sys.executable, "-m", "livox_infer.tools.cli", "export", "--install", "--if-missing",
           "--model", model_source, "--weights", str(weights), "--threads", str(threads),
           "--precision", precision, "--background-of", str(os.getpid())]
    if extent is not None:
        cmd += ["--bev-extent", *(repr(float(v)) for v in extent)]
    if flip:
        cmd.append("--test-time-flip")
    return cmd
