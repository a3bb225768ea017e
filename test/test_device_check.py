"""scripts/device_check.sh and livox_infer.bench.device_check, as far as a CPU can take them: one clear line
without a GPU or packages, the comparison / counting / report logic, and the whole run as a CPU dry run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from livox_infer.bench import device_check as dc
from livox_infer.errors import BackendError

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "device_check.sh"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")


def run_script(*args: str, timeout: float = 60.0, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full_env, timeout=timeout)


@no_gpu
def test_script_without_a_gpu_ends_in_one_clear_line():
    out = run_script()
    assert out.returncode == 2, out
    assert out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("device_check: no usable GPU: torch ")


def test_script_names_missing_packages_in_one_line(tmp_path):
    bare = tmp_path / "bare_python"  # an interpreter without site-packages: no torch, no pip
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    out = run_script(PYTHON=str(bare), DEVICE_CHECK_WHEELS=str(tmp_path / "nowhere"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out
    assert "lacks torch" in out.stderr and "no wheel folder" in out.stderr
    assert "not part of the repository" in out.stderr and "pip download" in out.stderr  # how to get one
    (tmp_path / "wheels").mkdir()
    out = run_script(PYTHON=str(bare), DEVICE_CHECK_WHEELS=str(tmp_path / "wheels"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out
    assert "pip could not install torch" in out.stderr
    out = run_script(PYTHON=str(tmp_path / "no_such_python"))
    assert out.returncode == 2 and "no Python interpreter" in out.stderr


def test_cuda_device_needs_a_cuda_build_and_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(BackendError, match="CPU build"):
        dc.require_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendError, match="sees no GPU"):
        dc.require_device("cuda")
    assert dc.require_device("cpu").type == "cpu"


class D(SimpleNamespace):
    def __len__(self):
        return len(self.scores)


def make(boxes, labels, scores):
    return D(boxes=np.asarray(boxes, np.float32).reshape(-1, 7), labels=np.asarray(labels, np.int64),
             scores=np.asarray(scores, np.float32))


def test_compare_detections_matches_within_tolerance_only():
    box = [10.0, 2.0, 0.8, 4.2, 1.8, 1.5, 0.1]
    ped = [5.0, -1.0, 0.9, 0.6, 0.6, 1.7, 0.0]
    ref = make([box, ped], [0, 1], [0.9, 0.6])
    assert dc.compare_detections(ref, make([ped, box], [1, 0], [0.6, 0.9])).ok  # order does not matter
    near = make([[10.02, 2.0, 0.8, 4.2, 1.8, 1.5, 0.1], ped], [0, 1], [0.905, 0.6])
    m = dc.compare_detections(ref, near)
    assert m.ok and abs(m.max_centre_m - 0.02) < 1e-5 and abs(m.max_score - 0.005) < 1e-5
    assert not dc.compare_detections(ref, make([[10.2, 2.0, 0.8, 4.2, 1.8, 1.5, 0.1], ped], [0, 1], [0.9, 0.6])).ok
    assert not dc.compare_detections(ref, make([box, ped], [0, 2], [0.9, 0.6])).ok  # wrong class
    assert not dc.compare_detections(ref, make([box], [0], [0.9])).ok  # a box missing
    assert not dc.compare_detections(ref, make([box, ped, ped], [0, 1, 1], [0.9, 0.6, 0.5])).ok  # one too many


def test_graph_replays_are_counted_and_the_patch_removed(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda self: calls.append(self))
    stub = torch.cuda.CUDAGraph.replay
    with dc.count_graph_replays() as counter:
        torch.cuda.CUDAGraph.replay("g1")
        torch.cuda.CUDAGraph.replay("g2")
    assert counter.count == 2 and calls == ["g1", "g2"]
    assert torch.cuda.CUDAGraph.replay is stub


def result(mode, matches, replays=0, compiled=True):
    return dc.ModeResult(mode, 1.0, compiled, [1.0, 2.0, 3.0], [0.5] * 3, replays, matches)


def test_report_fails_on_different_boxes_idle_graphs_or_a_failed_compile(capsys):
    good, bad = dc.BoxMatch(3, 3, 3, 0.001, 0.0001), dc.BoxMatch(3, 2, 2, 0.001, 0.0001)
    cuda = torch.device("cuda")
    assert dc.pipeline_report([result("eager", [good]), result("cuda graphs", [good], replays=3)], 3, cuda)
    assert not dc.pipeline_report([result("eager", [good, bad])], 3, cuda)
    assert not dc.pipeline_report([result("cuda graphs", [good], replays=0)], 3, cuda)
    assert not dc.pipeline_report([result("compiled", [good], compiled=False)], 3, cuda)
    out = capsys.readouterr().out
    assert "FAIL CUDA graphs: 0 graph replays in 3 frames" in out and "| mode" in out


def test_voxelizer_check_fails_when_the_voxelizer_differs(monkeypatch, capsys):
    from livox_infer.bench.voxelize import run_check
    from livox_infer.voxelize import Voxelizer

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the plain-torch path: quick
    assert run_check(torch.device("cpu"), small=True)
    forward = Voxelizer.forward
    monkeypatch.setattr(Voxelizer, "forward", lambda self, pts: forward(self, pts) + (pts.shape[0] > 1000))
    assert not run_check(torch.device("cpu"), small=True)
    assert "FAIL livox_24k" in capsys.readouterr().out


@pytest.mark.slow  # a few eager frames, two voxelize sizes; ~30 s on a 2-core machine
def test_cpu_dry_run_of_the_whole_script():
    out = run_script("--device", "cpu", "--small", "--frames", "2", "--iters", "3", timeout=900,
                     TRITON_INTERPRET="0")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    for expected in ("CHECK PASSED", "ok   boxes eager on cpu vs cpu eager: 2/2 frames equal",
                     "| eager |", "|  2,000 |", "| 24,000 |", "DEVICE CHECK PASSED"):
        assert expected in text, expected


@pytest.mark.slow  # one AOTInductor export of lite (~20-60 s) + a few frames
def test_cpu_dry_run_checks_the_package_fast_path_too(tmp_path):
    """The fast path (an AOTInductor package exported by the check itself, in a private folder and manifest) gives
    the eager boxes and a row of its own; the user's manifest is not touched."""
    manifest = tmp_path / "user_manifest.json"
    out = run_script("--device", "cpu", "--small", "--frames", "2", "--iters", "3", "--modes", "eager,package",
                     timeout=1200, TRITON_INTERPRET="0", LIVOX_INFER_AOTI_MANIFEST=str(manifest))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    for expected in ("package exported for cpu in", "ok   boxes package on cpu vs cpu eager: 2/2 frames equal",
                     "| package |", "DEVICE CHECK PASSED"):
        assert expected in text, expected
    assert not manifest.exists()
