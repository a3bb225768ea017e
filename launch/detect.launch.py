"""Start the livox_infer detector node with a sensor preset.

    ros2 launch livox_infer detect.launch.py sensor:=avia
    ros2 launch livox_infer detect.launch.py sensor:=horizon input_topic:=/points device:=cpu use_compile:=false
    ros2 launch livox_infer detect.launch.py params_file:=/path/to/my.yaml
    ros2 launch livox_infer detect.launch.py sensor:=horizon rig:=rigs/livox_dataset_v1.yaml

The preset YAML (config/<sensor>.yaml, or params_file) gives every parameter, including `sensor`;
input_topic, device, use_compile and rig override it only when given (empty = keep the YAML's value).
"""

import os

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

SENSORS = ("mid40", "mid70", "tele15", "horizon", "avia")


def _share_dir() -> str:
    try:
        from ament_index_python.packages import get_package_share_directory

        return get_package_share_directory("livox_infer")
    except Exception:  # noqa: BLE001 - pip install without ament index registration
        from livox_infer.resources import share_dir

        return str(share_dir())


def _node(context, *args, **kwargs):
    sensor = LaunchConfiguration("sensor").perform(context)
    if sensor not in SENSORS:
        raise RuntimeError(f"sensor must be one of {SENSORS}, got {sensor!r}")
    params_file = LaunchConfiguration("params_file").perform(context) or os.path.join(
        _share_dir(), "config", f"{sensor}.yaml")
    if not os.path.isfile(params_file):
        raise RuntimeError(f"params_file not found: {params_file}")
    # The YAML names its own sensor; the sensor argument only picks the default YAML.
    overrides = {}
    for name in ("input_topic", "device", "rig"):
        value = LaunchConfiguration(name).perform(context)
        if value:
            overrides[name] = value
    use_compile = LaunchConfiguration("use_compile").perform(context).strip().lower()
    if use_compile:
        if use_compile not in ("true", "false"):
            raise RuntimeError(f"use_compile must be true or false, got {use_compile!r}")
        overrides["use_compile"] = use_compile == "true"
    return [
        Node(
            package="livox_infer",
            executable="detector_node",
            name=LaunchConfiguration("node_name").perform(context),
            output="screen",
            emulate_tty=True,
            parameters=[params_file, overrides] if overrides else [params_file],
        )
    ]


def generate_launch_description() -> LaunchDescription:
    return LaunchDescription([
        DeclareLaunchArgument("sensor", default_value="avia", choices=list(SENSORS),
                              description="Livox sensor preset; selects config/<sensor>.yaml"),
        DeclareLaunchArgument("params_file", default_value="",
                              description="parameter YAML (default: the package's config/<sensor>.yaml)"),
        DeclareLaunchArgument("input_topic", default_value="", description="override the input cloud topic"),
        DeclareLaunchArgument("device", default_value="", description="override device: auto, cpu or cuda"),
        DeclareLaunchArgument("rig", default_value="", description="rig YAML: several LiDARs merged (docs/rigs.md)"),
        DeclareLaunchArgument("use_compile", default_value="", description="override use_compile: true or false"),
        DeclareLaunchArgument("node_name", default_value="livox_detector", description="node name"),
        OpaqueFunction(function=_node),
    ])
