"""`ros2 launch livox_infer detect.launch.py lifecycle:=true` with the upstream tools: the real node (real pipeline,
cpu, eager) comes up unconfigured, configure (lifecycle_msgs ChangeState, as `ros2 lifecycle set` calls it) loads the
weights, activate makes a replayed cloud come out as detections; Ctrl-C ends the launch with rc 0."""

from __future__ import annotations

import time

import pytest

from ros_upstream import Background, ros_env, run, skip_reason

pytestmark = [pytest.mark.ros, pytest.mark.slow]  # one launched node with the real pipeline: ~30 s

if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)

NODE = "lifecycle_launch_detector"
TOPIC = "/lifecycle_launch_points"


def test_launch_lifecycle_true_configures_and_activates_through_the_lifecycle_services(tmp_path):
    import rclpy
    from lifecycle_msgs.msg import State, Transition
    from lifecycle_msgs.srv import ChangeState, GetState
    from rclpy.context import Context
    from vision_msgs.msg import Detection3DArray

    from livox_infer.ros.node import create_executor

    env = ros_env()
    bag = tmp_path / "drive"
    r = run(["livox-infer", "simulate", "--sensor", "horizon", "--frames", "2", "--seed", "4", "--out", str(bag)],
            env, timeout=120)
    assert r.returncode == 0, r.stderr
    launch = Background(["ros2", "launch", "livox_infer", "detect.launch.py", "sensor:=horizon", "use_compile:=false",
                         "device:=cpu", f"input_topic:={TOPIC}", "lifecycle:=true", f"node_name:={NODE}"], env,
                        tmp_path / "launch.log")
    ctx = Context()
    rclpy.init(context=ctx, domain_id=int(env["ROS_DOMAIN_ID"]))
    node = rclpy.create_node("lifecycle_launch_test", context=ctx)
    executor = create_executor(ctx)
    executor.add_node(node)
    received: list = []
    node.create_subscription(Detection3DArray, f"/{NODE}/detections", received.append, 10)

    def call(client, request, timeout=120.0):
        future = client.call_async(request)
        executor.spin_until_future_complete(future, timeout_sec=timeout)
        assert future.done(), launch.output()[-3000:]
        return future.result()

    try:
        change = node.create_client(ChangeState, f"/{NODE}/change_state")
        get = node.create_client(GetState, f"/{NODE}/get_state")
        assert change.wait_for_service(timeout_sec=90) and get.wait_for_service(timeout_sec=30), launch.output()[-3000:]
        assert call(get, GetState.Request()).current_state.id == State.PRIMARY_STATE_UNCONFIGURED
        assert "building model" not in launch.output()  # nothing loaded before configure
        assert call(change, ChangeState.Request(transition=Transition(id=Transition.TRANSITION_CONFIGURE))).success
        assert call(change, ChangeState.Request(transition=Transition(id=Transition.TRANSITION_ACTIVATE))).success
        assert call(get, GetState.Request()).current_state.id == State.PRIMARY_STATE_ACTIVE
        deadline = time.monotonic() + 60
        while not any(m.detections for m in received) and time.monotonic() < deadline:
            replay = run(["livox-infer", "replay", str(bag), "--rate", "2", "--remap", f"/livox/lidar:={TOPIC}",
                          "--topics", "/livox/lidar"], env, timeout=60)
            assert replay.returncode == 0, replay.stdout + replay.stderr
            end = time.monotonic() + 3
            while time.monotonic() < end:
                executor.spin_once(timeout_sec=0.1)
        assert any(m.detections for m in received), launch.output()[-3000:]
    finally:
        executor.shutdown()
        node.destroy_node()
        ctx.try_shutdown()
        rc = launch.stop()
    out = launch.output()
    assert "Traceback" not in out and rc == 0, out[-3000:]
