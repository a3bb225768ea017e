"""livox_infer/params.py: one parameter table; the presets, the generated artefacts, the pipeline's defaults and
sensor-height check, and the shared CLI options derive from it."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import yaml

from livox_infer.detector.config import ModelConfig
from livox_infer.errors import ConfigError
from livox_infer.params import (
    BY_NAME, DEFAULTS, PARAMS, SENSOR_PRESETS, class_params, parse_sensor_height, pipeline_options, validate,
)
from livox_infer.presets import load_preset, read_param_file

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "config"

# What every preset set before the presets became one base file + per-sensor overrides (the five 44-line
# config/<sensor>.yaml of commit d7689d3): the merged presets and the model's class thresholds must equal them.
OLD_COMMON = {
    "accumulate_frames": 1, "accumulate_ms": 0.0, "accumulate_track_motion": True, "aoti_package": "", "device": "auto", "diagnostics_period": 1.0,
    "estimate_ground": False, "frame_id": "", "input_topic": "/livox/lidar", "input_type": "pointcloud2",
    "intensity_scale": 255.0, "latency_window": 300, "max_points": 200000, "model": "lite", "odometry_topic": "",
    "publish_markers": True, "refine": True, "rig": "", "roi_x_min": 0.0, "roi_z_min": -3.0,
    # models/lite.yaml's operating thresholds (stage 12: car, pedestrian, cyclist the best F1 on the cross-validated
    # real detections; truck, bus on held-out simulated frames)
    **{f"score_threshold_{c}": t for c, t in zip(ModelConfig.load("lite").classes, ModelConfig.load("lite").score_thresholds)},
    "sensor_height": 1.8, "tag_filter": "high_confidence", "test_time_flip": False, "threads": 1,
    "use_compile": True, "weights": "",
    "build_package": True,  # issue 33: without a matching package, eager at once while it is built in the background
    "compile_in_background": True,  # issue 33: torch.compile in the node: eager at once while a thread compiles / loads
    "precision": "auto",  # issue 33: bf16 backbone and neck on a CPU with AMX
    # issue 32: tracking (livox_infer/tracking), on by default; gates per class from the tracker's table
    "tracking": True, "tracking_confirm_hits": 2, "tracking_max_misses": 8, "tracking_coast_frames": 3,
    "tracking_confirm_score": 0.7, "tracking_low_score": 0.1,  # confirmation by score, second association
    "tracking_gate_car": 2.5, "tracking_gate_pedestrian": 1.2, "tracking_gate_cyclist": 1.8,
    "tracking_gate_truck": 3.5, "tracking_gate_bus": 3.5,
    # issue 31: TF (livox_infer/ros/tf.py), off by default
    "output_frame": "", "odometry_frame": "", "tf_timeout": 0.1,
}
OLD_PER_SENSOR = {
    "avia": {"bev_extent": [0.0, 80.0, -41.6, 41.6], "max_range": 120.0, "roi_x_max": 80.0, "roi_y_max": 40.0,
             "roi_y_min": -40.0, "roi_z_max": 3.0},
    "horizon": {"bev_extent": [0.0, 80.0, -41.6, 41.6], "max_range": 90.0, "roi_x_max": 80.0, "roi_y_max": 40.0,
                "roi_y_min": -40.0, "roi_z_max": 3.0},
    "mid40": {"bev_extent": [0.0, 80.0, -28.8, 28.8], "max_range": 90.0, "roi_x_max": 80.0, "roi_y_max": 28.0,
              "roi_y_min": -28.0, "roi_z_max": 3.0},
    "mid70": {"bev_extent": [0.0, 60.8, -41.6, 41.6], "max_range": 90.0, "roi_x_max": 60.0, "roi_y_max": 42.0,
              "roi_y_min": -42.0, "roi_z_max": 3.0},
    "tele15": {"bev_extent": [0.0, 153.6, -19.2, 19.2], "max_range": 200.0, "roi_x_max": 150.0, "roi_y_max": 20.0,
               "roi_y_min": -20.0, "roi_z_max": 4.0},
}


def effective(sensor: str) -> dict:
    values = load_preset(sensor)
    return {**{p.name: p.default for p in class_params(values["model"])}, **values}


@pytest.mark.parametrize("sensor", SENSOR_PRESETS)
def test_presets_keep_the_values_of_the_old_full_preset_files(sensor):
    assert effective(sensor) == {**OLD_COMMON, **OLD_PER_SENSOR[sensor], "sensor": sensor}


def test_generated_artefacts_are_up_to_date():
    from livox_infer.tools.params import stale

    assert stale() == [], "run `livox-infer params --write` and commit the result"


def test_params_check_fails_on_an_outdated_artefact(tmp_path):
    from livox_infer.tools.params import ARTEFACTS, GENERATORS, stale

    for kind, rel in ARTEFACTS.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(GENERATORS[kind]())
    assert stale(tmp_path) == []
    (tmp_path / ARTEFACTS["markdown"]).write_text(GENERATORS["markdown"]().replace("`lite`", "`lite2`", 1))
    assert stale(tmp_path) == [ARTEFACTS["markdown"]]


def test_base_file_holds_exactly_the_table_defaults():
    assert read_param_file(CONFIG / "detector.param.yaml") == {k: v for k, v in DEFAULTS.items() if v is not None}


@pytest.mark.parametrize("sensor", SENSOR_PRESETS)
def test_override_files_hold_only_what_differs_each_line_with_a_why(sensor):
    path = CONFIG / f"{sensor}.param.yaml"
    override = read_param_file(path)
    assert override["sensor"] == sensor
    same = [k for k, v in override.items() if k != "sensor" and v == DEFAULTS[k]]
    assert not same, f"{path.name} repeats defaults: {same}"
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s{4}(\w+):", line)
        if m and m.group(1) != "sensor":
            # the why on the line, on the line above, or shared with the line above (roi_y_min / roi_y_max)
            assert "#" in line or lines[i - 1].lstrip().startswith("#") or "#" in lines[i - 1], line


def test_schema_accepts_the_parameter_files_and_refuses_typos_and_bad_values():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "schema" / "detector.schema.json").read_text())
    for path in sorted(CONFIG.glob("*.param.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    jsonschema.validate({"/**": {"ros__parameters": {"score_threshold_truck": 0.5}}}, schema)
    for bad in ({"max_rnage": 80.0}, {"max_range": 0.1}, {"device": "tpu"}, {"score_threshold_car": 1.5},
                {"use_compile": "yes"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"/**": {"ros__parameters": bad}}, schema)


def test_validate_checks_each_value_and_across_parameters():
    assert validate(DEFAULTS) is None
    cases = {
        "roi_x_min (90.0) must be smaller": {"roi_x_min": 90.0},
        "device must be one of": {"device": "tpu"},
        "max_range must be a number in": {"max_range": 0.1},
        "max_points must be an integer": {"max_points": 2.5},
        "refine must be true or false": {"refine": "yes"},
        "bev_extent needs x_min < x_max": {"bev_extent": [10.0, 0.0, -1.0, 1.0]},
        "either rig": {"input_topics": ["/a"], "rig": "r.yaml"},
        "sensor_height must be a number in": {"sensor_height": 9.7},
    }
    for reason, change in cases.items():
        assert reason in (validate({**DEFAULTS, **change}) or ""), change


def test_sensor_height_has_one_encoding_and_range():
    assert parse_sensor_height("auto") == "auto" and parse_sensor_height("1.5") == 1.5
    assert parse_sensor_height(0) == 0.0 and parse_sensor_height(9.5) == 9.5
    for bad in (-0.5, 9.7, "high", float("nan"), True):
        with pytest.raises(ConfigError, match=r"metres in \[0.0, 9.5\] or 'auto'"):
            parse_sensor_height(bad)
    assert BY_NAME["sensor_height"].range == (0.0, 9.5)
    from livox_infer.rig import Rig

    rig = yaml.safe_load((CONFIG / "rigs" / "livox_dataset_v1.yaml").read_text())
    with pytest.raises(ConfigError, match=r"rig: sensor_height must be metres in \[0.0, 9.5\]"):
        Rig.from_dict({**rig, "sensor_height": 12.0})


def test_pipeline_update_uses_the_table_range(small_model):  # noqa: F811
    from livox_infer.pipeline import DetectionPipeline

    pipe = DetectionPipeline(small_model, compile=False, sensor_height=1.6)
    for bad in (9.7, -0.5):  # (-1, 10) before: the node refused what the pipeline took
        with pytest.raises(ConfigError, match="sensor_height"):
            pipe.update(sensor_height=bad)
    pipe.update(sensor_height=9.5)
    assert pipe.params["sensor_height"] == 9.5


def test_pipeline_constructor_defaults_come_from_the_table():
    from livox_infer.pipeline import DetectionPipeline

    defaults = {k: v.default for k, v in inspect.signature(DetectionPipeline).parameters.items()}
    for kwarg, name in (("model", "model"), ("device", "device"), ("compile", "use_compile"),
                        ("sensor_height", "sensor_height"), ("tag_filter", "tag_filter"),
                        ("max_points", "max_points"), ("test_time_flip", "test_time_flip"), ("refine", "refine")):
        assert defaults[kwarg] == DEFAULTS[name], kwarg


def test_class_thresholds_come_from_the_model_config():
    from livox_infer.detector.config import ModelConfig

    for model in ("lite", "full"):
        cfg = ModelConfig.load(model)
        params = [p for p in class_params(model) if p.name.startswith("score_threshold_")]
        assert [p.name for p in params] == [f"score_threshold_{c}" for c in cfg.classes]
        assert [p.default for p in params] == list(cfg.score_thresholds)
        gates = [p.name for p in class_params(model) if not p.name.startswith("score_threshold_")]
        assert gates == [f"tracking_gate_{c}" for c in cfg.classes]  # the tracker's, one per class of the model
    opts = pipeline_options({**DEFAULTS, "score_threshold_car": 0.6, "tracking_gate_car": 3.0})
    assert opts["score_thresholds"] == {"car": 0.6}
    assert pipeline_options(DEFAULTS)["score_thresholds"] is None  # none given: the model's own


def test_no_class_names_outside_the_model_configs():
    """The node, the parameter model, the presets and the launch file know no class by name."""
    files = [REPO / "livox_infer" / f for f in ("params.py", "presets.py", "pipeline.py", "ros/node.py")]
    files += [REPO / "launch" / "detect.launch.py", *CONFIG.glob("*.param.yaml")]
    for path in files:
        text = path.read_text()
        assert not re.search(r"\b(pedestrian|cyclist)\b", text), path


SHARED = ["--model", "full", "--weights", "w.safetensors", "--no-compile", "--device", "cpu", "--sensor-height",
          "1.5", "--threads", "2"]


@pytest.mark.parametrize("argv", [
    ["detect", "x.pcd", "--out", "-", "--sensor", "horizon", *SHARED],
    ["eval", "--sim-frames", "1", "--sensor", "horizon", *SHARED],
    ["run", "--sensor", "horizon", *SHARED],
], ids=["detect", "eval", "run"])
def test_the_commands_share_one_option_vocabulary(argv):
    from livox_infer.tools.cli import build_parser

    args = build_parser(argv).parse_args(argv)
    assert (args.model, args.weights, args.compile, args.device, args.sensor, args.sensor_height, args.threads) == \
        ("full", "w.safetensors", False, "cpu", "horizon", 1.5, 2)
    flipped = [("--compile" if a == "--no-compile" else a) for a in argv]
    assert build_parser(flipped).parse_args(flipped).compile is True


def test_bench_pipeline_takes_the_shared_options():
    from livox_infer.tools.cli import build_parser

    argv = ["bench", "pipeline", *[a for a in SHARED if a != "--no-compile"], "--sensor", "mid40"]
    args = build_parser(argv).parse_args(argv)
    assert (args.model, args.device, args.sensor, args.sensor_height, args.threads) == ("full", "cpu", "mid40", 1.5, 2)
    for argv in (["export", "--model", "full"], ["export", "--config", "full"]):
        assert build_parser(argv).parse_args(argv).model == "full"
    for argv, compiled in ((["bench", "startup", "--no-compile"], False), (["bench", "startup", "--use-compile", "true"],
                           True), (["bench", "fleet", "archive", "--compile"], True), (["bench", "fleet", "archive"], False)):
        assert build_parser(argv).parse_args(argv).compile is compiled, argv


def test_the_table_is_complete_and_consistent():
    for p in PARAMS:
        assert p.doc and p.type in ("bool", "int", "double", "string", "double[]", "string[]"), p.name
        assert p.check(p.default) is None, p.name
        assert p.applies in ("rebuild", "update", "node"), p.name


from test_pipeline import small_model  # noqa: E402,F401 - fixture reuse
