"""compile_in_background (the node's default where torch.compile runs): eager detections at once, torch.compile of the
network and stage 2 in a thread, the switch between two frames, the same detections; a second start loads what the
first saved; a failure or a rebuild meanwhile leaves the pipeline eager (issue 33)."""

import shutil

import numpy as np
import pytest
import torch
import yaml

from conftest import tiny_model_dict
from livox_infer.detector import ModelConfig, build_model, save_weights
from livox_infer.pipeline import DetectionPipeline

# slow: torch.compile of a tiny network and its stage 2 (~20-60 s on 2 busy cores, twice: compiled, then loaded)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                                   reason="torch.compile on a CPU needs a C++ compiler")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("background")
    d = tiny_model_dict()
    d["head"]["top_k"] = 16
    d["score_thresholds"] = 0.0
    cfg_path = root / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(d))
    cfg = ModelConfig.load(cfg_path)
    torch.manual_seed(0)
    save_weights(build_model(cfg), cfg, root / "tiny.safetensors", extra={"trained": "no"})
    return cfg_path, root / "tiny.safetensors"


def _cloud():
    rng = np.random.default_rng(0)
    return np.c_[rng.uniform(0, 25, (3000, 2)) - [0, 12], rng.uniform(-1.5, 1.0, 3000),
                 rng.uniform(0, 255, 3000)].astype(np.float32)


def _pipe(tiny, **kw):
    cfg_path, weights = tiny
    return DetectionPipeline(cfg_path, weights=weights, compile=True, build_package=False, compile_in_background=True,
                             aoti_package=False, sensor_height=1.5, device="cpu", precision="fp32", **kw)


def test_detects_eagerly_then_switches_to_what_the_thread_compiled_and_a_restart_loads_it(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("LIVOX_INFER_CACHE_DIR", str(tmp_path / "cache"))  # nothing saved there yet
    cloud = _cloud()
    pipe = _pipe(tiny)
    assert pipe.network_backend == "eager" and pipe.background_compile_state is not None
    assert "eager until torch.compile is ready in the background" in pipe.startup.summary()
    eager = pipe.detect(cloud)  # at once, while the thread compiles
    assert pipe.wait_compiled(600) and pipe.network_backend == "compiled"
    assert pipe.background_compile_state is None and pipe.compile_error is None
    summary = pipe.startup.summary()
    assert "switched to torch.compile" in summary and "network compiled and saved" in summary, summary
    assert "stage2_refiner compiled and saved" in summary, summary
    assert pipe._stage2.compiled_refiner is not None
    compiled = pipe.detect(cloud)
    assert len(eager) > 0 and len(compiled) == len(eager)
    assert np.allclose(eager.boxes, compiled.boxes, atol=1e-4) and np.allclose(eager.scores, compiled.scores, atol=1e-5)

    again = _pipe(tiny)  # a restart: the thread loads what the first one saved
    assert again.network_backend == "eager"
    assert again.wait_compiled(600)
    summary = again.startup.summary()
    assert "network loaded" in summary and "stage2_refiner loaded" in summary, summary
    b = again.detect(cloud)
    assert np.allclose(b.boxes, compiled.boxes, atol=1e-4)


def test_a_failed_background_compile_leaves_it_eager_with_one_warning(tiny, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LIVOX_INFER_CACHE_DIR", str(tmp_path / "cache"))

    def broken(self, notes):
        raise RuntimeError("no compiler here\nsecond line")

    monkeypatch.setattr(DetectionPipeline, "_compile_detached", broken)
    pipe = _pipe(tiny)
    with caplog.at_level("WARNING"):
        assert not pipe.wait_compiled(60)
        pipe.detect(_cloud())
    assert pipe.network_backend == "eager" and pipe.compile_error == "RuntimeError: no compiler here"
    assert caplog.text.count("torch.compile in the background failed") == 1
    assert len(pipe.detect(_cloud())) > 0


def test_a_rebuild_or_close_drops_the_compile_running_for_the_old_settings(tiny, tmp_path, monkeypatch):
    import threading

    monkeypatch.setenv("LIVOX_INFER_CACHE_DIR", str(tmp_path / "cache"))
    release = threading.Event()

    def slow(self, notes):
        release.wait(60)
        return self._eager, None

    monkeypatch.setattr(DetectionPipeline, "_compile_detached", slow)
    pipe = _pipe(tiny)
    job = pipe._background
    pipe.update(compile=False)  # eager now: the running compile's result must not come back
    assert pipe._background is None and pipe.background_compile_state is None
    release.set()
    job.thread.join(10)
    pipe.detect(_cloud())
    assert pipe.network_backend == "eager" and not pipe.compiled

    release.clear()
    other = _pipe(tiny)
    other.close()
    release.set()
    other.detect(_cloud())
    assert other.network_backend == "eager"
