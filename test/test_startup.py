"""Start-up phases (livox_infer.startup): timed, logged by the pipeline, inductor cache cold vs warm told apart;
`livox-infer bench startup` times node start to first detection."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from livox_infer import startup
from livox_infer.startup import StartupLog

REPO = Path(__file__).resolve().parent.parent


def test_phases_are_timed_in_order_and_summarised():
    log = StartupLog()
    with log.phase("weights"):
        time.sleep(0.02)
    with log.phase("compile"):
        pass
    assert list(log.phases_s) == ["weights", "compile"] and log.phases_s["weights"] >= 0.02
    assert log.summary().startswith("weights 0.0 s, compile 0.0 s") and log.cache_state == ""


@pytest.mark.parametrize("hits, misses, bypasses, state", [(3, 0, 0, "warm"), (0, 2, 0, "cold"), (1, 1, 0, "partial"),
                                                           (0, 0, 1, "bypassed")])
def test_cache_state_from_the_counters_inside_the_block(monkeypatch, hits, misses, bypasses, state):
    counts = iter([{"hits": 5, "misses": 7, "bypasses": 1},
                   {"hits": 5 + hits, "misses": 7 + misses, "bypasses": 1 + bypasses}])
    monkeypatch.setattr(startup, "_cache_counts", lambda: next(counts))
    log = StartupLog()
    with log.inductor_cache():
        pass
    assert (log.cache_hits, log.cache_misses, log.cache_state) == (hits, misses, state)
    expected = ("inductor graph cache bypassed (1 graphs" if bypasses else
                f"inductor cache {state} ({hits} hits, {misses} misses)")
    assert expected in log.summary()


def test_pipeline_records_its_start_up():
    from livox_infer.pipeline import DetectionPipeline

    pipe = DetectionPipeline("lite", device="cpu", compile=False)
    assert list(pipe.startup.phases_s) == ["weights"] and pipe.startup.cache_state == ""


@pytest.mark.slow  # two real torch.compile runs: ~20 s
def test_cache_state_of_a_real_compile_cold_then_warm(monkeypatch, tmp_path):
    """torch's own counters: a fresh cache directory misses, the same graph compiled again hits."""
    import torch

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    states = []
    for _ in range(2):
        torch._dynamo.reset()
        log = StartupLog()
        with log.inductor_cache():
            torch.compile(lambda x: x * 2.0 + 1.0, fullgraph=True)(torch.ones(8))
        states.append(log.cache_state)
    assert states == ["cold", "warm"]


def _bench_startup(args: list[str], timeout: float) -> tuple[str, list[list[str]]]:
    """`livox-infer bench startup ARGS` (must succeed): (its output, the table's rows as lists of cells)."""
    pytest.importorskip("rclpy")
    pytest.importorskip("vision_msgs.msg")
    out = subprocess.run([sys.executable, "-m", "livox_infer.tools.cli", "bench", "startup", *args],
                         capture_output=True, text=True, timeout=timeout, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.stdout.splitlines()
            if line.startswith("| ") and "|---" not in line][1:]
    return out.stdout, rows


@pytest.mark.slow  # starts the node (eager) once: ~10-30 s on a 2-core machine
@pytest.mark.ros
def test_bench_startup_times_node_start_to_first_detection():
    stdout, rows = _bench_startup(["--runs", "1", "--use-compile", "false", "--timeout", "240"], 400)
    assert len(rows) == 1 and rows[0][0] == "eager" and any("weights" in c for c in rows[0]), stdout  # no compile
    assert float(rows[0][2]) > 0


@pytest.mark.slow  # a node builds its package in the background (~40-60 s), then a second start loads it
@pytest.mark.ros
def test_a_new_node_detects_at_once_and_a_restart_loads_the_package_it_built():
    """`livox-infer bench startup --modes new,restart`: the node's defaults on a machine without a package (the
    bench's empty cache folder): eager detections within seconds, then the node's line that the package built in the
    background runs; the next start loads that package."""
    stdout, rows = _bench_startup(["--modes", "new,restart", "--threads", "1", "--timeout", "400"], 900)
    assert [r[0] for r in rows] == ["new", "restart"], stdout
    new, restart = rows
    assert "eager until the AOTInductor package being built in the background is ready" in new[4]
    assert float(new[2]) < float(new[3])  # detections came before the package did
    assert "AOTInductor package lite.cpu." in restart[4] and "(built for this machine)" in restart[4]


def test_node_says_ready_once_with_the_phases_and_the_bench_reads_that_line():
    """One event, one line: `pipeline ready after N s (<phases>)` (there used to be a second `start-up:` line)."""
    from livox_infer.bench.startup import STARTUP_RE
    from livox_infer.ros.warmup import warming_up

    lines = []

    class Log:
        def info(self, msg):
            lines.append(msg)

    with warming_up(Log(), lambda s: None, 10.0, lambda: "weights 0.1 s, compile 9.9 s, cache warm (1 graphs)"):
        pass
    assert len(lines) == 1 and lines[0].startswith("pipeline ready after ")
    assert STARTUP_RE.search("[INFO] [det]: " + lines[0] + "\n").group(1) == (
        "weights 0.1 s, compile 9.9 s, cache warm (1 graphs)")


@pytest.mark.slow  # the node compiles with torch.compile (~40-60 s cold), then a second node loads what it saved
@pytest.mark.ros
def test_a_warm_torch_compile_start_loads_what_the_cold_one_saved():
    """`livox-infer bench startup --modes cold,warm`: the node with `build_package:=false` detects eagerly at once
    while a thread compiles and saves the network and stage 2's compiled parts (detector/precompiled.py), then runs
    them; the next start on the same machine loads them without tracing (issue 33: warm start ≤ 6 s), the same way."""
    stdout, rows = _bench_startup(["--modes", "cold,warm", "--threads", "1", "--timeout", "400"], 900)
    assert [r[0] for r in rows] == ["cold", "warm"], stdout
    cold, warm = rows
    assert "eager until torch.compile is ready in the background" in cold[4], stdout
    assert "network compiled and saved" in cold[4] and "stage2_refiner compiled and saved" in cold[4], stdout
    assert "network loaded" in warm[4] and "stage2_refiner loaded" in warm[4] and "bypassed" not in warm[4], stdout
    # first detections before the compiled network runs, which the warm start has sooner than the cold one
    assert 0 < float(cold[2]) < float(cold[3]) and 0 < float(warm[2]) < float(warm[3]) < float(cold[3]), stdout
