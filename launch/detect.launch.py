"""Start the livox_infer detector node with a sensor preset.

    ros2 launch livox_infer detect.launch.py sensor:=avia
    ros2 launch livox_infer detect.launch.py sensor:=horizon input_topic:=/points device:=cpu use_compile:=false
    ros2 launch livox_infer detect.launch.py params_file:=/path/to/my.yaml
    ros2 launch livox_infer detect.launch.py sensor:=horizon rig:=rigs/livox_dataset_v1.yaml

The preset YAML (config/<sensor>.yaml, or params_file) gives every parameter, including `sensor`;
input_topic, device, use_compile and rig override it only when given (empty = keep the YAML's value).
An argument this file does not declare is warned about (a typo would otherwise be ignored silently). When the
node exits, the launch ends; a node that failed (exit status 1: bad weights, bad parameters) makes
`ros2 launch` exit non-zero.
"""

import difflib
import os

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, Shutdown
from launch.logging import get_logger
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

SENSORS = ("mid40", "mid70", "tele15", "horizon", "avia")
ARGUMENTS = {
    "sensor": ("avia", "Livox sensor preset; selects config/<sensor>.yaml"),
    "params_file": ("", "parameter YAML (default: the package's config/<sensor>.yaml)"),
    "input_topic": ("", "override the input cloud topic"),
    "device": ("", "override device: auto, cpu or cuda"),
    "rig": ("", "rig YAML: several LiDARs merged (docs/rigs.md)"),
    "use_compile": ("", "override use_compile: true or false"),
    "node_name": ("livox_detector", "node name"),
}


def _share_dir() -> str:
    try:
        from ament_index_python.packages import get_package_share_directory

        return get_package_share_directory("livox_infer")
    except Exception:  # noqa: BLE001 - pip install without ament index registration
        from livox_infer.resources import share_dir

        return str(share_dir())


def _warn_about_undeclared_arguments(context) -> None:
    # Configurations of a launch file that includes this one are visible here too, so an unknown name is
    # warned about, not refused.
    for name in sorted(set(context.launch_configurations) - set(ARGUMENTS)):
        hint = difflib.get_close_matches(name, ARGUMENTS, n=1)
        get_logger("livox_infer.launch").warning(
            f"launch argument '{name}' is not one of detect.launch.py's ({', '.join(ARGUMENTS)}) and is ignored"
            + (f"; did you mean '{hint[0]}'?" if hint else ""))


def end_launch_with_the_node(event, context):
    """on_exit of the node: end the launch; a failed node (non-zero exit) makes `ros2 launch` exit 1.

    launch returns 1 when an event handler raises, so a failure raises (with the reason) instead of a quiet
    Shutdown; an exit during a shutdown already under way (Ctrl-C) is not a failure."""
    if event.returncode != 0 and not context.is_shutdown:
        raise RuntimeError(f"{event.action.name} exited with status {event.returncode}; see its messages above")
    return [Shutdown(reason=f"{event.action.name} exited")]


def _node(context, *args, **kwargs):
    _warn_about_undeclared_arguments(context)
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
            on_exit=end_launch_with_the_node,
        )
    ]


def generate_launch_description() -> LaunchDescription:
    declared = [DeclareLaunchArgument(name, default_value=default, description=description,
                                      **({"choices": list(SENSORS)} if name == "sensor" else {}))
                for name, (default, description) in ARGUMENTS.items()]
    return LaunchDescription([*declared, OpaqueFunction(function=_node)])
