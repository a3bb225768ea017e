"""Competing CPU load for benchmarks: N busy processes, as a robot's driver, SLAM and planner would be.

    with busy_processes(2):
        ...  # timed code runs while two other processes spin

The processes are always stopped when the block ends (normally, on an exception or Ctrl-C); each
also exits by itself once its parent is gone, so a bench killed with SIGKILL leaves none behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

# Spin until the parent (the bench) goes away; checking getppid() every ~10 ms of work costs nothing.
_BUSY_LOOP = (
    "import os\n"
    "parent = int(os.environ['LIVOX_BENCH_PARENT'])\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(100_000):\n"
    "        pass\n"
)


def process_count(text: str) -> int:
    """argparse type of ``--load``: a count of busy processes, >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of processes, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"number of busy processes must be >= 0, got {n}")
    return n


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[list[subprocess.Popen]]:
    """Start ``n`` busy-looping Python processes for the duration of the block (n = 0: none)."""
    if n < 0:
        raise ValueError(f"number of busy processes must be >= 0, got {n}")
    env = dict(os.environ, LIVOX_BENCH_PARENT=str(os.getpid()))
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", _BUSY_LOOP], env=env,
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
