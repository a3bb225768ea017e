"""CPU thread budget: how many threads torch may use for one frame, set once per process.

A robot's CPU is never idle (driver, SLAM, planner). With torch's default (one thread per core) a
single competing busy process makes every parallel region wait for its slowest thread, and p99
latency explodes; one thread per frame keeps p50 and p99 close (numbers: docs/performance.md).

The budget must be set before torch starts its thread pools: ``set_num_interop_threads`` raises
once inter-op work has run, and each thread takes the intra-op count when it first runs parallel
work. ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` are exported too, so child processes (inductor's
compile workers, a node started by ``replay --soak``) inherit the same budget.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

# Measured (docs/performance.md): 1 thread is as fast as 2 on a quiet 2-core machine and keeps
# p99 bounded when another process competes for a core.
DEFAULT_THREADS = 1
MAX_THREADS = 256
THREADS_HELP = ("torch CPU threads per frame; 0 = torch's default (one per core). "
                f"Default {DEFAULT_THREADS}: bounded latency on a CPU shared with other processes")
_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class ThreadBudget:
    """What took effect: requested count (0 = torch default), intra-op and inter-op threads in use,
    and why the inter-op count could not be set (torch started its pool first), if so."""

    requested: int
    intra_op: int
    inter_op: int
    inter_op_note: str = ""

    def describe(self) -> str:
        text = f"{self.intra_op} intra-op / {self.inter_op} inter-op"
        if self.requested == 0:
            text += " (torch default)"
        return text + (f"; {self.inter_op_note}" if self.inter_op_note else "")


def thread_count(text: str) -> int:
    """argparse type: an integer in [0, MAX_THREADS]."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a thread count, got {text!r}") from None
    if not 0 <= n <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"thread count must be in [0, {MAX_THREADS}], got {n}")
    return n


def add_threads_argument(parser: argparse.ArgumentParser, default: int | None = DEFAULT_THREADS) -> None:
    """The one ``--threads`` option of every command that runs the pipeline (applied by cli.main);
    ``default=None`` leaves the choice to someone else (the node's ``threads`` parameter)."""
    parser.add_argument("--threads", type=thread_count, default=default, metavar="N",
                        help=THREADS_HELP if default is not None else THREADS_HELP + " (given: overrides the node parameter)")


def apply_threads(threads: int) -> ThreadBudget:
    """Set torch's intra-op and inter-op thread counts (0 = leave torch's defaults) and export them
    to child processes. Safe to call again: the inter-op count is left as it is when torch has
    already started that pool, which the returned budget reports."""
    import torch

    if not 0 <= int(threads) <= MAX_THREADS:
        raise ValueError(f"thread count must be in [0, {MAX_THREADS}], got {threads}")
    note = ""
    if threads > 0:
        for var in _ENV_VARS:
            os.environ[var] = str(threads)
        torch.set_num_threads(threads)
        if torch.get_num_interop_threads() != threads:
            try:
                torch.set_num_interop_threads(threads)
            except RuntimeError:  # the pool already runs; only a fresh process can change it
                note = "inter-op pool already started"
    return ThreadBudget(int(threads), torch.get_num_threads(), torch.get_num_interop_threads(), note)
