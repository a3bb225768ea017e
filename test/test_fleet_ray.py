"""`livox-infer detect --out-dir ... --ray`: the same outputs and manifest as the local run, written by Ray workers.

One local 2-CPU Ray cluster for the whole module (start-up takes ~15 s on a loaded 2-core machine)."""

import json
import os

import pytest
import torch

from test_fleet import make_archive, manifest, rows, run
from test_pipeline import small_model  # noqa: F401 - fixture reuse

ray = pytest.importorskip("ray", reason="ray is not installed (optional extra: pip install -r requirements-ray.txt)")
torch.set_num_threads(1)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def ray_cluster():
    # the workers import this checkout, as the test process does (conftest puts it on sys.path)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, saved) if p)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.mark.slow
def test_ray_and_local_runs_give_the_same_detections_and_manifest(ray_cluster, small_model, tmp_path):  # noqa: F811
    archive = make_archive(tmp_path / "archive")
    common = [str(archive), "--model", str(small_model), "--no-compile", "--score-threshold", "0.0",
              "--annotated-bags"]
    assert run(common + ["--out-dir", str(tmp_path / "local")]) == 1  # the damaged file fails in both
    assert run(common + ["--out-dir", str(tmp_path / "ray"), "--ray", "--workers", "2"]) == 1
    local, remote = manifest(tmp_path / "local"), manifest(tmp_path / "ray")
    assert set(local) == set(remote) == {"a.pcd", "day1/c.npy", "day1/drive", "day1/broken.bin"}
    same = ("status", "frames", "boxes", "output", "model", "weights_sha256", "settings_sha256")
    for name in local:
        assert {k: local[name][k] for k in same} == {k: remote[name][k] for k in same}, name
        if local[name]["status"] == "ok":
            assert rows(tmp_path / "ray" / local[name]["output"]) == rows(tmp_path / "local" / local[name]["output"])
    # written by Ray worker processes, not by this one
    assert all(not r["worker"].endswith(f":{os.getpid()}") for r in remote.values())
    assert any(r["boxes"] for r in remote.values())
    assert (tmp_path / "ray" / "day1" / "drive.annotated" / "metadata.yaml").is_file()
    # resumable on Ray as well: nothing left to do but the damaged input
    assert run(common + ["--out-dir", str(tmp_path / "ray"), "--ray"]) == 1
    lines = [json.loads(line) for line in (tmp_path / "ray" / "manifest.jsonl").read_text().splitlines()]
    assert [r["name"] for r in lines[4:]] == ["day1/broken.bin"]
