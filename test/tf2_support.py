"""tf2_ros for the tests: from a ROS 2 install, else from <venv>/ros2_tf2 (scripts/setup_tf2.sh builds upstream
geometry2 there). In this process its shared libraries are loaded by path first, because the type-support lookup
of rmw opens them by name and LD_LIBRARY_PATH cannot change in a running process; child processes get the prefix's
setup.sh environment (``tf2_env``)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

PREFIX = Path(os.environ.get("LIVOX_INFER_TF2_PREFIX") or Path(sys.prefix) / "ros2_tf2")


def _site(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def load_tf2():
    """Import tf2_ros (and tf2_msgs) into this process, or return the reason it cannot be."""
    try:
        import tf2_msgs.msg  # noqa: F401
        import tf2_ros

        return tf2_ros
    except ImportError:
        pass
    if not (PREFIX / "setup.sh").is_file():
        return f"tf2_ros is not importable and {PREFIX} is not built (scripts/setup_tf2.sh; make setup runs it)"
    for lib in sorted((PREFIX / "lib").glob("*.so")):
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    sys.path.insert(0, str(_site(PREFIX)))
    import tf2_msgs.msg  # noqa: F401
    import tf2_ros

    return tf2_ros


def tf2_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` plus what <prefix>/setup.sh adds (PYTHONPATH, LD_LIBRARY_PATH, AMENT_PREFIX_PATH)."""
    if not (PREFIX / "setup.sh").is_file():
        return env
    out = subprocess.run(["bash", "-c", f"source '{PREFIX}/setup.sh' && env -0"], check=True, capture_output=True,
                         timeout=30, env=env).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def static_transform(parent: str, child: str, matrix, stamp_ns: int = 0):
    """geometry_msgs/TransformStamped of a 4x4 ``matrix`` (child points -> parent)."""
    from geometry_msgs.msg import TransformStamped

    from livox_infer.transforms import matrix_to_quaternion

    t = TransformStamped()
    t.header.frame_id, t.child_frame_id = parent, child
    t.header.stamp.sec, t.header.stamp.nanosec = divmod(int(stamp_ns), 1_000_000_000)
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (float(v) for v in matrix[:3, 3])
    q = matrix_to_quaternion(matrix[:3, :3])
    t.transform.rotation.x, t.transform.rotation.y, t.transform.rotation.z, t.transform.rotation.w = q
    return t
