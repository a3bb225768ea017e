"""CPU thread budget (livox_infer.threads): applied before torch starts its pools, inherited by threads
and child processes, one --threads option on every command that runs the pipeline; bench helpers
(busy processes for --load, aligned tables)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import types

import pytest

from livox_infer.tools import cli
from livox_infer.bench.load import busy_processes
from livox_infer.bench.table import format_table
from livox_infer.threads import DEFAULT_THREADS, add_threads_argument, thread_count

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, timeout: float = 120.0) -> str:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                         timeout=timeout, check=True)
    return out.stdout.strip()


@pytest.mark.slow  # subprocesses importing torch: ~5 s
def test_budget_reaches_a_worker_thread_and_child_processes():
    """A fresh process: the count set in the main thread holds in a thread started later (the node's
    worker) and in a child process; the inter-op pool is set too."""
    out = run_python("""
        import os, subprocess, sys, threading
        from livox_infer.threads import apply_threads
        import torch
        budget = apply_threads(2)
        seen = []
        def work():
            torch.ones(256, 256) @ torch.ones(256, 256)
            seen.append(torch.get_num_threads())
        t = threading.Thread(target=work); t.start(); t.join()
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"],
                               capture_output=True, text=True).stdout.strip()
        print(budget.intra_op, budget.inter_op, repr(budget.inter_op_note), seen[0], child)
    """)
    assert out == "2 2 '' 2 2"


@pytest.mark.slow  # a subprocess importing torch: ~6 s
def test_a_started_inter_op_pool_is_reported_not_fatal():
    out = run_python("""
        from livox_infer.threads import apply_threads
        apply_threads(1)
        b = apply_threads(2)
        print(b.intra_op, b.inter_op, b.describe())
    """)
    assert out.startswith("2 1 ") and "inter-op pool already started" in out


@pytest.mark.slow  # a subprocess importing torch: ~5 s
def test_zero_leaves_torchs_defaults():
    out = run_python("""
        import torch
        default = torch.get_num_threads()
        from livox_infer.threads import apply_threads
        b = apply_threads(0)
        print(b.intra_op == default, b.describe())
    """)
    assert out.startswith("True") and "torch default" in out


@pytest.mark.parametrize("text", ["-1", "x", "1.5", "257"])
def test_thread_count_rejects_nonsense(text):
    with pytest.raises(argparse.ArgumentTypeError):
        thread_count(text)


@pytest.mark.parametrize("argv", [["detect", "a.pcd", "--out", "o.jsonl"], ["eval", "bag"], ["export"],
                                  ["bench", "pipeline"], ["bench", "voxelize"]])
def test_every_pipeline_command_has_the_one_threads_option(argv):
    assert cli.build_parser(argv).parse_args(argv).threads == DEFAULT_THREADS
    assert cli.build_parser(argv).parse_args(argv + ["--threads", "3"]).threads == 3
    with pytest.raises(SystemExit):
        cli.build_parser(argv).parse_args(argv + ["--threads", "-2"])


@pytest.mark.parametrize("argv", [["run"], ["replay", "bag"]])
def test_node_commands_leave_the_default_to_the_node_parameter(argv):
    pytest.importorskip("rclpy")
    assert cli.build_parser(argv).parse_args(argv).threads is None
    assert cli.build_parser(argv).parse_args(argv + ["--threads", "2"]).threads == 2


def test_bench_pipeline_load_takes_a_process_count():
    assert cli.build_parser(["bench", "pipeline"]).parse_args(["bench", "pipeline", "--load", "2"]).load == 2
    for bad in ("-1", "x"):
        with pytest.raises(SystemExit):
            cli.build_parser(["bench", "pipeline"]).parse_args(["bench", "pipeline", "--load", bad])


def test_cli_applies_threads_before_the_command_runs(monkeypatch):
    fake = types.ModuleType("livox_fake_command")
    fake.add_arguments = add_threads_argument
    seen = []
    fake.main = lambda args: seen.append(os.environ.get("OMP_NUM_THREADS")) or 0
    monkeypatch.setitem(sys.modules, "livox_fake_command", fake)
    monkeypatch.setitem(cli.COMMANDS, "fake", ("livox_fake_command", "test"))
    applied = []
    monkeypatch.setattr("livox_infer.threads.apply_threads", lambda n: applied.append(n) or os.environ.update(
        OMP_NUM_THREADS=str(n)))
    monkeypatch.setenv("OMP_NUM_THREADS", "99")
    assert cli.main(["fake", "--threads", "3"]) == 0
    assert applied == [3] and seen == ["3"]


# -- bench helpers ----------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_busy_processes_run_inside_the_block_and_stop_after_it():
    with busy_processes(2) as procs:
        pids = [p.pid for p in procs]
        time.sleep(0.2)
        assert len(pids) == 2 and all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C inside the block
        with busy_processes(1) as procs:
            raise KeyboardInterrupt
    assert procs[0].poll() is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_busy_processes_exit_when_the_bench_is_killed():
    code = ("import sys, time; sys.path.insert(0, %r)\n"
            "from livox_infer.bench.load import busy_processes\n"
            "with busy_processes(1) as p:\n    print(p[0].pid, flush=True); time.sleep(60)\n") % REPO
    bench = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(bench.stdout.readline())
    assert _alive(child)
    bench.send_signal(signal.SIGKILL)  # no finally runs: the child must notice by itself
    bench.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_table_columns_are_aligned_and_separated():
    text = format_table(["mode", "total p50 / p99", "boxes"], [["eager", "35.10 / 37.80", "8.7"],
                                                                ["compiled", "3.40 / 144.00", "-"]])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1  # aligned
    assert lines[1].startswith("|---") and lines[1].endswith("-:|")  # Markdown rule, numbers right-aligned
    assert lines[2] == "| eager    |   35.10 / 37.80 |   8.7 |"
    with pytest.raises(ValueError):
        format_table(["a", "b"], [["1"]])


def test_bench_pipeline_times_each_mode_quiet_and_under_load(monkeypatch, capsys):
    """A short real run: one row per load for the mode, in one aligned table; the busy processes are gone after."""
    from livox_infer.bench import load, pipeline

    started = []

    @contextlib.contextmanager
    def recording(n):
        with load.busy_processes(n) as procs:
            started.extend(procs)
            yield procs

    monkeypatch.setattr(pipeline, "busy_processes", recording)
    argv = ["bench", "pipeline", "--modes", "eager", "--frames", "1", "--iters", "2", "--warmup", "1", "--load", "1"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| eager")]
    assert [r.split("|")[3].strip() for r in rows] == ["0", "1"]  # load column
    assert len({len(line) for line in out.splitlines() if line.startswith("|")}) == 1
    assert len(started) == 1 and started[0].poll() is not None


def test_bench_pipeline_tracking_adds_the_trackers_time_to_the_total(capsys):
    """--tracking: a 'track' column and 'total + track' = total + track per call (issue 32: node p99 with tracking)."""
    argv = ["bench", "pipeline", "--modes", "eager", "--frames", "2", "--iters", "4", "--warmup", "2", "--tracking"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| mode"))
    names = [c.strip() for c in header.strip("|").split("|")]
    (row,) = [line for line in out.splitlines() if line.startswith("| eager")]
    cells = dict(zip(names, (c.strip() for c in row.strip("|").split("|"))))
    track_p50 = float(cells["track p50 / p99"].split("/")[0])
    total_p50 = float(cells["total p50 / p99"].split("/")[0])
    with_p50 = float(cells["total + track p50 / p99"].split("/")[0])
    assert 0.0 < track_p50 < 50.0
    assert with_p50 >= total_p50


def test_bench_pipeline_interleave_takes_the_pipelines_calls_in_turn():
    """--interleave: warm-up and timed calls go round the pipelines one call each, so a machine that slows down
    mid-run slows every mode alike; each pipeline gets its own rows; the ratio line divides by eager's p50."""
    from types import SimpleNamespace

    from livox_infer.bench.pipeline import STAGES, _ratios, time_interleaved

    calls = []

    class Fake:
        def __init__(self, name, ms):
            self.name, self.ms = name, ms

        def detect(self, msg):
            calls.append((self.name, msg))
            return Det(self.ms)

    class Det(list):  # no boxes, the timings of one call
        def __init__(self, ms):
            super().__init__()
            self.timings_ms = dict.fromkeys(STAGES, ms)
    args = SimpleNamespace(warmup=1, iters=3, tracking=False)
    (ta, _), (tb, _) = time_interleaved([Fake("a", 10.0), Fake("b", 7.0)], ["m0", "m1"], args)
    assert [c[0] for c in calls] == ["a", "b"] * 4
    assert [c[1] for c in calls if c[0] == "a"] == ["m0", "m1", "m0", "m1"]
    assert len(ta["total"]) == len(tb["total"]) == 3 and ta["total"][0] == 10.0 and tb["total"][0] == 7.0
    rows = [[m, 1, 0] + ["x"] * STAGES.index("total") + [f"{v:.2f} / {v:.2f}"] for m, v in (("eager", 10.0), ("aoti", 7.0))]
    assert _ratios(rows, ["eager", "aoti"], [0]) == ["load 0: aoti 0.70"]
