"""The detector as a lifecycle (managed) node (`detector_node --lifecycle`, `ros2 launch ... lifecycle:=true`), driven
through its real lifecycle services (lifecycle_msgs/ChangeState, GetState) on loopback; fake pipeline."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")
lifecycle_msgs = pytest.importorskip("lifecycle_msgs")

from lifecycle_msgs.msg import State, Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import PointCloud2  # noqa: E402
from vision_msgs.msg import Detection3DArray  # noqa: E402

from livox_infer.ros.node import managed_node_class  # noqa: E402
from test_node_rig import publish_while  # noqa: E402
from test_node_support import Collector, FakeFactory, cloud_msg, unique, wait_for  # noqa: E402

pytestmark = pytest.mark.ros


class Lifecycle:
    """ChangeState / GetState clients for one node, called from the test thread (the harness spins)."""

    def __init__(self, client, node_name: str) -> None:
        self.change = client.create_client(ChangeState, f"/{node_name}/change_state")
        self.get = client.create_client(GetState, f"/{node_name}/get_state")
        assert self.change.wait_for_service(timeout_sec=10) and self.get.wait_for_service(timeout_sec=10)

    def _call(self, client, request):
        future = client.call_async(request)
        assert wait_for(future.done, timeout_s=30), "lifecycle service did not answer"
        return future.result()

    def transition(self, transition_id: int) -> bool:
        return self._call(self.change, ChangeState.Request(transition=Transition(id=transition_id))).success

    def state(self) -> int:
        return self._call(self.get, GetState.Request()).current_state.id


def start(ros, params: dict, factory=None):
    factory = factory or FakeFactory()
    name = unique("managed")
    overrides = [Parameter("use_compile", value=False)] + [Parameter(k, value=v) for k, v in params.items()]
    node = ros.add(managed_node_class()(pipeline_factory=factory, node_name=name, context=ros.context,
                                        parameter_overrides=overrides))
    client = ros.node(unique("client"))
    return node, client, Lifecycle(client, name), factory


def test_configure_loads_activate_publishes_deactivate_stops_cleanup_drops(ros):
    topic = "/" + unique("cloud")
    node, client, lc, factory = start(ros, {"input_topic": topic})
    assert lc.state() == State.PRIMARY_STATE_UNCONFIGURED and factory.built == []  # nothing loaded yet
    assert lc.transition(Transition.TRANSITION_CONFIGURE)
    assert lc.state() == State.PRIMARY_STATE_INACTIVE and len(factory.built) == 1
    pub = client.create_publisher(PointCloud2, topic, 10)
    dets = Collector(client, Detection3DArray, f"{node.get_fully_qualified_name()}/detections")
    assert wait_for(lambda: pub.get_subscription_count() == 1 and node._det_pub.get_subscription_count() == 1)
    # inactive: clouds are taken and counted, nothing is published
    assert publish_while(pub, cloud_msg(stamp_ns=1_000_000_000), lambda: node.stats.skipped_inactive >= 1)
    assert dets.msgs == []
    diag = {kv.key: kv.value for kv in node.diagnostics_status().values}
    assert diag["lifecycle"] == "inactive" and "inactive" in node.diagnostics_status().message
    assert lc.transition(Transition.TRANSITION_ACTIVATE) and lc.state() == State.PRIMARY_STATE_ACTIVE
    assert publish_while(pub, cloud_msg(stamp_ns=2_000_000_000), lambda: len(dets.msgs) >= 1)
    assert len(dets.msgs[0].detections) == 1
    assert lc.transition(Transition.TRANSITION_DEACTIVATE) and lc.state() == State.PRIMARY_STATE_INACTIVE
    count = len(dets.msgs)
    skipped = node.stats.skipped_inactive
    assert publish_while(pub, cloud_msg(stamp_ns=3_000_000_000), lambda: node.stats.skipped_inactive > skipped)
    assert len(dets.msgs) == count
    assert lc.transition(Transition.TRANSITION_CLEANUP) and lc.state() == State.PRIMARY_STATE_UNCONFIGURED
    assert node.pipeline is None and not node._worker.is_alive()
    assert wait_for(lambda: pub.get_subscription_count() == 0)  # the subscription is gone
    # and up again: a new pipeline, publishing
    assert lc.transition(Transition.TRANSITION_CONFIGURE) and lc.transition(Transition.TRANSITION_ACTIVATE)
    assert len(factory.built) == 2
    assert publish_while(pub, cloud_msg(stamp_ns=4_000_000_000), lambda: len(dets.msgs) > count)


def test_configure_with_missing_weights_fails_and_stays_unconfigured(ros):
    node, _, lc, factory = start(ros, {"weights": "/missing.safetensors"})
    assert not lc.transition(Transition.TRANSITION_CONFIGURE)
    assert lc.state() == State.PRIMARY_STATE_UNCONFIGURED and node.pipeline is None and factory.built == []
    # fixed over the parameter service while unconfigured, configure then succeeds
    node.set_parameters([Parameter("weights", value="")])
    assert lc.transition(Transition.TRANSITION_CONFIGURE) and lc.state() == State.PRIMARY_STATE_INACTIVE


def test_detector_node_flag_and_run_option_select_the_managed_node(monkeypatch):
    from livox_infer.ros import node as node_module

    seen = {}
    monkeypatch.setattr(node_module, "spin_node", lambda argv, factory=None, exiting=False: seen.update(
        argv=argv, factory=factory) or 0)
    assert node_module.main(["detector_node", "--lifecycle", "--ros-args", "-p", "device:=cpu"]) == 0
    assert seen["factory"] is not None and seen["factory"].__name__ == "ManagedDetectorNode"
    assert node_module.main(["detector_node", "--ros-args"]) == 0 and seen["factory"] is None
    from test_node_live import _parse

    assert node_module.main(_parse(["--sensor", "avia", "--lifecycle"])) == 0
    assert seen["factory"].__name__ == "ManagedDetectorNode"
