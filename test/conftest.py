"""Test-wide settings. TRITON_INTERPRET must be set before any @triton.jit runs, so it is set here,
before test modules import the kernels: CI has no GPU and runs the Triton kernels in the interpreter."""

import os
import signal
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests must not talk to other ROS graphs on the machine.
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
os.environ.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))

# A suite started in the background of a non-interactive shell (`bash .ci/run &`) inherits SIGINT ignored, and every
# node, launch and replay process the tests start and then Ctrl-C would inherit that too and never stop (five
# Ctrl-C tests timed out that way). The tests send Ctrl-C on purpose: give it back its default meaning.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def tiny_model_dict(stem_channels: int = 4) -> dict:
    """models/lite.yaml shrunk to a 25.6 m grid and a few channels: fast to train, export and run in tests."""
    import yaml

    d = yaml.safe_load((REPO / "models" / "lite.yaml").read_text())
    d["grid"].update(x_range=[0.0, 25.6], y_range=[-12.8, 12.8])
    d["backbone"] = {"stem_channels": stem_channels, "stem_stride": 2, "stage_channels": [8, 8],
                     "stage_blocks": [1, 1], "neck_channels": 8}
    d["head"]["head_channels"] = 8
    d["weights"] = "tiny.safetensors"
    return d


@pytest.fixture
def ros():
    """A RosHarness (test_node_support: its own rclpy context and executor), closed after the test."""
    from test_node_support import RosHarness  # rclpy only for the tests that ask for it

    h = RosHarness()
    yield h
    h.close()
