"""Start the livox_infer detector node with a sensor preset.

    ros2 launch livox_infer detect.launch.py sensor:=avia
    ros2 launch livox_infer detect.launch.py sensor:=horizon input_topic:=/points device:=cpu use_compile:=false
    ros2 launch livox_infer detect.launch.py params_file:=/path/to/my.yaml
    ros2 launch livox_infer detect.launch.py sensor:=horizon rig:=rigs/livox_dataset_v1.yaml

The node loads config/detector.param.yaml (every default) and then config/<sensor>.param.yaml (what differs for
that sensor), or params_file instead of the latter; input_topic, device, use_compile, rig and model override them
only when given (empty = keep the files' value). Arguments, their meaning and checks come from livox_infer.params.
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

from livox_infer.errors import ConfigError
from livox_infer.params import BY_NAME, SENSOR_PRESETS, check_values, parse_bool, read_params_file

# node parameters a launch argument may override; empty = keep the parameter files' value
OVERRIDES = ("input_topic", "device", "rig", "use_compile", "model")
ARGUMENTS = {
    "sensor": ("avia", BY_NAME["sensor"].doc),
    "params_file": ("", "parameter YAML loaded over config/detector.param.yaml instead of config/<sensor>.param.yaml"),
    **{name: ("", f"override {name}: {BY_NAME[name].doc}") for name in OVERRIDES},
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
    if sensor not in SENSOR_PRESETS:
        raise RuntimeError(f"sensor must be one of {SENSOR_PRESETS}, got {sensor!r}")
    config = os.path.join(_share_dir(), "config")
    params_file = LaunchConfiguration("params_file").perform(context) or os.path.join(config, f"{sensor}.param.yaml")
    if not os.path.isfile(params_file):
        raise RuntimeError(f"params_file not found: {params_file}")
    try:  # unknown names and wrong types stop the launch with one line (rclpy would ignore or mix them)
        check_values(read_params_file(params_file), params_file)
    except ConfigError as exc:
        raise RuntimeError(str(exc)) from None
    # The files name their own sensor; the sensor argument only picks the default override file.
    overrides = {}
    for name in OVERRIDES:
        value = LaunchConfiguration(name).perform(context).strip()
        if value:
            overrides[name] = _argument_value(name, value)
    files = [os.path.join(config, "detector.param.yaml"), params_file]
    return [
        Node(
            package="livox_infer",
            executable="detector_node",
            name=LaunchConfiguration("node_name").perform(context),
            output="screen",
            emulate_tty=True,
            parameters=[*files, overrides] if overrides else files,
            on_exit=end_launch_with_the_node,
        )
    ]


def _argument_value(name: str, text: str):
    """A launch argument (text) as the node parameter's type, checked against livox_infer.params."""
    param = BY_NAME[name]
    if param.type == "bool":
        try:
            value = parse_bool(text)
        except Exception as exc:  # noqa: BLE001 - argparse.ArgumentTypeError
            raise RuntimeError(f"{name} must be true or false, got {text!r}") from exc
    else:
        value = text
    reason = param.check(value)
    if reason:
        raise RuntimeError(reason)
    return value


def generate_launch_description() -> LaunchDescription:
    declared = [DeclareLaunchArgument(name, default_value=default, description=description,
                                      **({"choices": list(SENSOR_PRESETS)} if name == "sensor" else {}))
                for name, (default, description) in ARGUMENTS.items()]
    return LaunchDescription([*declared, OpaqueFunction(function=_node)])
