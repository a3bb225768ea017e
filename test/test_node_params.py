"""Every sensor preset YAML loads through ROS's own parameter-file parser and its values reach the
node and the pipeline; `livox-infer run` starts the node from a preset without ros2 launch."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")

from livox_infer.ros.node import DetectorNode, add_arguments, ros_arguments
from livox_infer.params import BY_NAME, class_params  # noqa: E402
from livox_infer.detector.config import ModelConfig  # noqa: E402
from livox_infer.presets import SENSOR_PRESETS, load_preset, preset_files, read_param_file  # noqa: E402
from test_node_support import FakeFactory, unique  # noqa: E402

pytestmark = pytest.mark.ros
CONFIG = Path(__file__).resolve().parent.parent / "config"


def test_there_is_one_preset_per_sensor_over_one_base():
    assert sorted(p.name for p in CONFIG.glob("*.yaml")) == \
        sorted(["detector.param.yaml", *(f"{s}.param.yaml" for s in SENSOR_PRESETS)])


def test_the_base_sets_every_parameter_and_an_override_only_known_ones():
    base = read_param_file(CONFIG / "detector.param.yaml")
    optional = {n for n, spec in BY_NAME.items() if spec.default is None}  # arrays that may stay unset
    assert set(base) == set(BY_NAME) - optional
    for sensor in SENSOR_PRESETS:
        assert set(read_param_file(CONFIG / f"{sensor}.param.yaml")) <= set(BY_NAME), sensor


@pytest.mark.parametrize("sensor", SENSOR_PRESETS)
def test_preset_yaml_reaches_the_node_and_pipeline(ros, sensor):
    values = load_preset(sensor)
    assert values["sensor"] == sensor
    factory = FakeFactory()
    files = [x for path in preset_files(sensor) for x in ("--params-file", str(path))]
    node = ros.add(DetectorNode(pipeline_factory=factory, node_name=unique(f"det_{sensor}"), context=ros.context,
                                cli_args=["--ros-args", *files]))
    for name, value in values.items():
        assert node.get_parameter(name).value == value, name
    for param in class_params(values["model"]):  # the model's classes, its config's thresholds
        assert node.get_parameter(param.name).value == param.default, param.name
    opts = factory.built[0].options
    assert opts["roi"] == (values["roi_x_min"], values["roi_y_min"], values["roi_z_min"],
                           values["roi_x_max"], values["roi_y_max"], values["roi_z_max"])
    lite = ModelConfig.load("lite")
    assert opts["score_thresholds"] == dict(zip(lite.classes, lite.score_thresholds))  # models/lite.yaml
    assert opts["sensor_height"] == values["sensor_height"]
    assert opts["model"] == values["model"] and opts["max_range"] == values["max_range"]
    assert opts["bev_extent"] == tuple(values["bev_extent"])


def test_class_thresholds_follow_the_loaded_model(ros, tmp_path):
    """score_threshold_<class> is declared for the model's own classes with its config's defaults; a model with
    other classes is refused at run time (the declared parameters cannot follow it)."""
    from rclpy.parameter import Parameter

    node = ros.add(DetectorNode(pipeline_factory=FakeFactory(), node_name=unique("full"), context=ros.context,
                                cli_args=["--ros-args", "-p", "model:=full"]))
    assert node.get_parameter("score_threshold_pedestrian").value == 0.25  # models/full.yaml
    result = node.set_parameters([Parameter("model", value="lite")])[0]  # five classes: full has three
    assert not result.successful and "other classes" in result.reason
    assert node.set_parameters([Parameter("model", value="lite-sim")])[0].successful  # the same three


def test_invalid_preset_values_stop_start_up(ros, tmp_path):
    bad = load_preset("avia")
    bad["roi_y_min"], bad["roi_y_max"] = 10.0, -10.0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": bad}}))
    with pytest.raises(ValueError, match="roi_y_min"):
        DetectorNode(pipeline_factory=FakeFactory(), node_name=unique("bad"), context=ros.context,
                     cli_args=["--ros-args", "--params-file", str(path)])


def run_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_run_builds_ros_arguments_from_the_preset_and_overrides():
    args = run_args("--sensor", "horizon", "--input-topic", "/points", "--device", "cpu", "--use-compile", "false",
                    "--ros-args", "-p", "score_threshold_car:=0.5")
    argv = ros_arguments(args)
    assert argv[1:6] == ["--ros-args", "--params-file", argv[3], "--params-file", argv[5]]
    assert Path(argv[3]).name == "detector.param.yaml" and Path(argv[5]).name == "horizon.param.yaml"
    assert argv[6:] == ["-p", "input_topic:=/points", "-p", "device:=cpu",
                        "-p", "use_compile:=false", "-p", "score_threshold_car:=0.5"]
    assert ros_arguments(run_args("--no-compile", "--sensor-height", "auto", "--model", "full"))[6:] == \
        ["-p", "model:=full", "-p", "use_compile:=false", "-p", "estimate_ground:=true"]


def _run_cli(argv: list[str], wait_for_text: str | None, timeout_s: float = 60.0) -> tuple[int, str]:
    """Run ``livox-infer run ...``; stop it with SIGINT once ``wait_for_text`` is printed."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", RCUTILS_LOGGING_BUFFERED_STREAM="0")
    proc = subprocess.Popen([sys.executable, "-m", "livox_infer.tools.cli", "run", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if wait_for_text and wait_for_text in "".join(lines):
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.1)
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=5)
    return rc, "".join(lines)


@pytest.mark.slow  # starts `livox-infer run` in a subprocess: ~9 s
def test_run_fails_at_start_up_on_missing_weights(tmp_path):
    pytest.importorskip("livox_infer.pipeline")
    missing = tmp_path / "missing.safetensors"
    rc, out = _run_cli(["--sensor", "avia", "--device", "cpu", "--use-compile", "false", "--ros-args",
                        "-p", f"weights:={missing}", "-p", "input_topic:=/" + unique("nothing")], None)
    assert rc != 0, out
    assert "FATAL" in out and "missing.safetensors" in out, out


@pytest.mark.slow  # starts the real node in a subprocess: ~7 s
def test_run_starts_the_node_from_a_preset():
    pytest.importorskip("livox_infer.pipeline")
    rc, out = _run_cli(["--sensor", "mid70", "--device", "cpu", "--use-compile", "false",
                        "--ros-args", "-p", "input_topic:=/" + unique("nothing")], "detecting on")
    assert "detecting on" in out and "mid70" in out, out
    assert rc == 0, out


def test_threads_parameter_is_applied_at_start_and_reported(ros, monkeypatch):
    import torch

    before = torch.get_num_threads()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # restored after the test
        monkeypatch.setenv(var, "1")
    try:
        node = ros.add(DetectorNode(pipeline_factory=FakeFactory(), node_name=unique("threads"), context=ros.context,
                                    cli_args=["--ros-args", "-p", "threads:=2"]))
        assert torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
        values = {kv.key: kv.value for kv in node.diagnostics_status().values}
        assert values["threads"].startswith("2 intra-op")
        assert not node.set_parameters([__import__("rclpy").parameter.Parameter("threads", value=1)])[0].successful
    finally:
        torch.set_num_threads(before)


def test_run_passes_threads_to_the_node_only_when_given():
    assert not any(a.startswith("threads:=") for a in ros_arguments(run_args("--sensor", "avia")))
    assert ros_arguments(run_args("--sensor", "avia", "--threads", "2"))[-2:] == ["-p", "threads:=2"]
@pytest.mark.parametrize("sensor", SENSOR_PRESETS)
def test_preset_header_shows_the_launch_command_that_works(sensor):
    """`sensor=avia` is not a launch argument (ros2 launch takes NAME:=VALUE): the header shows what to type."""
    header = [line for line in (CONFIG / f"{sensor}.param.yaml").read_text().splitlines() if line.startswith("#")]
    assert f"#   ros2 launch livox_infer detect.launch.py sensor:={sensor}" in header
    assert not any(f"sensor={sensor}" in line for line in header)


def test_integer_values_in_a_parameter_file_are_taken_for_doubles(ros, tmp_path):
    path = tmp_path / "ints.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": {"max_range": 80, "roi_x_max": 60}}}))
    node = ros.add(DetectorNode(pipeline_factory=FakeFactory(), node_name=unique("ints"), context=ros.context,
                                cli_args=["--ros-args", "--params-file", str(path)]))
    assert node.get_parameter("max_range").value == 80.0 and node.get_parameter("roi_x_max").value == 60.0
