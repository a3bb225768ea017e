"""Start the livox_infer detector node with a sensor preset.

    ros2 launch livox_infer detect.launch.py sensor:=avia
    ros2 launch livox_infer detect.launch.py sensor:=horizon input_topic:=/points device:=cpu use_compile:=false
    ros2 launch livox_infer detect.launch.py params_file:=/path/to/my.yaml
    ros2 launch livox_infer detect.launch.py sensor:=horizon rig:=rigs/livox_dataset_v1.yaml
    ros2 launch livox_infer detect.launch.py sensor:=avia input_type:=custom_msg output_frame:=base_link rviz:=true

The node loads config/detector.param.yaml (every default) and then config/<sensor>.param.yaml (what differs for
that sensor), or params_file instead of the latter; input_topic, input_type, output_frame, device, use_compile, rig,
model and use_sim_time override them only when given (empty = keep the files' value). Arguments, their meaning and
checks come from livox_infer.params. rviz:=true also starts rviz2 with rviz/detect.rviz (its topics and fixed frame
set from these arguments), or warns in one line when rviz2 is not installed.
An argument this file does not declare is warned about (a typo would otherwise be ignored silently). When the
node exits, the launch ends; a node that failed (exit status 1: bad weights, bad parameters) makes
`ros2 launch` exit non-zero.
"""

import difflib
import os
import shutil
import tempfile

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction, Shutdown
from launch.logging import get_logger
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode, Node

from livox_infer.errors import ConfigError
from livox_infer.params import BY_NAME, INPUT_TYPES, SENSOR_PRESETS, check_values, parse_bool, read_params_file

# node parameters a launch argument may override; empty = keep the parameter files' value
OVERRIDES = ("input_topic", "input_type", "output_frame", "device", "rig", "use_compile", "model")
ARGUMENTS = {
    "sensor": ("avia", BY_NAME["sensor"].doc),
    "params_file": ("", "parameter YAML loaded over config/detector.param.yaml instead of config/<sensor>.param.yaml"),
    **{name: ("", f"override {name}: {BY_NAME[name].doc}") for name in OVERRIDES},
    "use_sim_time": ("", "true: the node's clock follows /clock (a bag played with --clock); sets the node's "
                         "use_sim_time parameter; empty = keep the files' value (false)"),
    "rviz": ("false", "true: also start rviz2 with rviz/detect.rviz (cloud, markers, detections; fixed frame = "
                      "output_frame, else the rig's, else livox_frame); a warning when rviz2 is not installed"),
    "lifecycle": ("false", "true: run the node as a lifecycle (managed) node: configure loads and checks the "
                           "weights, activate starts publishing (ros2 lifecycle set /<node_name> configure)"),
    "node_name": ("livox_detector", "node name"),
}
DEFAULT_FIXED_FRAME = "livox_frame"  # livox_ros_driver2's frame_id


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
    if context.is_shutdown:  # Ctrl-C or a shutdown already under way: a second one would stop launch_ros's ROS
        return None          # adapter twice (a lifecycle node: "Cannot shutdown a ROS adapter that is not running")
    if event.returncode != 0:
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
    sim_time = LaunchConfiguration("use_sim_time").perform(context).strip()
    if sim_time:  # rclpy's own parameter: not in livox_infer.params, checked here
        overrides["use_sim_time"] = _bool_argument("use_sim_time", sim_time)
    files = [os.path.join(config, "detector.param.yaml"), params_file]
    node_name = LaunchConfiguration("node_name").perform(context)
    managed = _bool_argument("lifecycle", LaunchConfiguration("lifecycle").perform(context).strip() or "false")
    node_action, extra = (LifecycleNode, {"namespace": "", "arguments": ["--lifecycle"]}) if managed else (Node, {})
    actions = [
        node_action(
            **extra,
            package="livox_infer",
            executable="detector_node",
            name=node_name,
            output="screen",
            emulate_tty=True,
            parameters=[*files, overrides] if overrides else files,
            on_exit=end_launch_with_the_node,
        )
    ]
    if _bool_argument("rviz", LaunchConfiguration("rviz").perform(context).strip() or "false"):
        actions += _rviz(context, node_name, overrides, [*files])
    return actions


def _rviz(context, node_name: str, overrides: dict, files: list[str]) -> list:
    """rviz2 with rviz/detect.rviz, its topics and fixed frame set for this launch; [] (one warning) without rviz2."""
    rviz2 = shutil.which("rviz2")
    if rviz2 is None:
        try:
            from ament_index_python.packages import get_package_prefix

            candidate = os.path.join(get_package_prefix("rviz2"), "lib", "rviz2", "rviz2")
            rviz2 = candidate if os.access(candidate, os.X_OK) else None
        except Exception:  # noqa: BLE001 - PackageNotFoundError, no AMENT_PREFIX_PATH
            rviz2 = None
    if rviz2 is None:
        get_logger("livox_infer.launch").warning(
            "rviz:=true but rviz2 is not installed (apt install ros-<distro>-rviz2); the node runs without it. "
            "Foxglove: open rviz/detect.foxglove.json (docs/node.md)")
        return []
    values = {}
    for path in files:  # the topic and frames the node will use: files, then the launch arguments
        try:
            values.update(read_params_file(path))
        except ConfigError:
            pass
    values.update(overrides)
    frame = values.get("output_frame") or _rig_frame(values.get("rig")) or DEFAULT_FIXED_FRAME
    config = rviz_config(os.path.join(_share_dir(), "rviz", "detect.rviz"), node_name,
                         values.get("input_topic") or BY_NAME["input_topic"].default, frame)
    return [ExecuteProcess(cmd=[rviz2, "-d", config, "-f", frame], name="rviz2", output="screen")]


def _rig_frame(rig: str | None) -> str | None:
    if not rig:
        return None
    try:
        from livox_infer.resources import find
        from livox_infer.rig import Rig

        return Rig.load(find("config", rig)).output_frame
    except Exception:  # noqa: BLE001 - the node reports a bad rig itself
        return None


def rviz_config(template: str, node_name: str, input_topic: str, fixed_frame: str) -> str:
    """A copy of rviz/detect.rviz for this launch (node topics, input topic, fixed frame); its path."""
    with open(template, encoding="utf-8") as f:
        text = f.read()
    text = (text.replace("/livox_detector/", f"/{node_name}/").replace("Value: /livox/lidar", f"Value: {input_topic}")
            .replace(f"Fixed Frame: {DEFAULT_FIXED_FRAME}", f"Fixed Frame: {fixed_frame}"))
    if not _has_package("vision_msgs_rviz_plugins"):  # RViz would show a plugin error for that display
        begin, end = "    # vision_msgs_rviz_plugins begin", "    # vision_msgs_rviz_plugins end\n"
        if begin in text and end in text:
            text = text[:text.index(begin)] + text[text.index(end) + len(end):]
    fd, path = tempfile.mkstemp(prefix="livox_infer_", suffix=".rviz")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _has_package(name: str) -> bool:
    try:
        from ament_index_python.packages import get_package_prefix

        get_package_prefix(name)
        return True
    except Exception:  # noqa: BLE001 - PackageNotFoundError, no AMENT_PREFIX_PATH
        return False


def _bool_argument(name: str, text: str) -> bool:
    try:
        return parse_bool(text)
    except Exception as exc:  # noqa: BLE001 - argparse.ArgumentTypeError
        raise RuntimeError(f"{name} must be true or false, got {text!r}") from exc


def _argument_value(name: str, text: str):
    """A launch argument (text) as the node parameter's type, checked against livox_infer.params."""
    param = BY_NAME[name]
    if param.type == "bool":
        value = _bool_argument(name, text)
    else:
        value = text
    reason = param.check(value)
    if reason:
        raise RuntimeError(reason)
    return value


def generate_launch_description() -> LaunchDescription:
    declared = [DeclareLaunchArgument(name, default_value=default, description=description,
                                      **({"choices": list(SENSOR_PRESETS)} if name == "sensor" else
                                         {"choices": ["", *INPUT_TYPES]} if name == "input_type" else {}))
                for name, (default, description) in ARGUMENTS.items()]
    return LaunchDescription([*declared, OpaqueFunction(function=_node)])
