"""Sensor presets: config/detector.param.yaml (every default, generated from livox_infer.params) under a small
config/<sensor>.param.yaml with only what differs for that sensor.

One merge for the node (``ros2 launch`` and ``livox-infer run`` load the same two files in this order) and the
offline CLIs (`livox-infer detect/eval --sensor NAME`), so offline results equal what the node publishes with the
same preset. ROS-free: the files are ROS 2 parameter files, read here as plain YAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from livox_infer.errors import ConfigError
from livox_infer.params import SENSOR_PRESETS, pipeline_options

BASE_FILE = "detector.param.yaml"


def base_path() -> Path:
    from livox_infer.resources import find

    return find("config", BASE_FILE)


def preset_path(sensor: str) -> Path:
    """The sensor's override file (only the lines that differ from the base)."""
    from livox_infer.resources import find

    if sensor not in SENSOR_PRESETS:
        raise ConfigError(f"unknown sensor preset {sensor!r}; presets: {list(SENSOR_PRESETS)}")
    return find("config", f"{sensor}.param.yaml")


def preset_files(sensor: str) -> list[Path]:
    """The parameter files of a preset, in load order (later ones win)."""
    return [base_path(), preset_path(sensor)]


def read_param_file(path: Path) -> dict[str, Any]:
    """A ROS 2 parameter file's ``/**: ros__parameters`` mapping."""
    import yaml

    try:
        return dict(yaml.safe_load(Path(path).read_text())["/**"]["ros__parameters"] or {})
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a ROS 2 parameter file with '/**: ros__parameters' ({exc})") from None


def load_preset(sensor: str) -> dict[str, Any]:
    """The preset's parameter values: the base file with the sensor's overrides applied."""
    values: dict[str, Any] = {}
    for path in preset_files(sensor):
        values.update(read_param_file(path))
    return values


def preset_pipeline_options(sensor: str) -> dict[str, Any]:
    """DetectionPipeline keyword arguments of a sensor preset, as the node builds its pipeline."""
    return pipeline_options(load_preset(sensor))


def cli_pipeline_options(sensor: str | None, given: dict[str, Any], command_line: dict[str, Any],
                         defaults: dict[str, Any]) -> dict[str, Any]:
    """DetectionPipeline options of an offline command (detect, eval): the --sensor preset's (else ``defaults``),
    then ``given`` (options typed on the command line; None = not given), then ``command_line`` (always the
    command line's: the model, weights and how to run)."""
    if sensor:
        base = {k: v for k, v in preset_pipeline_options(sensor).items() if k not in command_line}
    else:
        base = dict(defaults)
    # an offline command compiles before its first cloud (build_package and compile_in_background are the node's: a
    # run that switches networks half-way through would not give the same boxes twice)
    return {**base, **{k: v for k, v in given.items() if v is not None}, **command_line, "build_package": False,
            "compile_in_background": False}
