"""Test-wide settings. TRITON_INTERPRET must be set before any @triton.jit runs, so it is set here,
before test modules import the kernels: CI has no GPU and runs the Triton kernels in the interpreter."""

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests must not talk to other ROS graphs on the machine.
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
os.environ.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
