"""The ``detector_node`` program (``ros2 run`` / ``ros2 launch``): imports the node (rclpy, the message packages,
numpy: seconds) inside the Ctrl-C guard, so an interrupt while they load is one line and exit status 130, not a
KeyboardInterrupt traceback and a death by signal ("process has died, exit code -2" under ros2 launch)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from livox_infer.ros.node import main as node_main

        return node_main(argv)
    except KeyboardInterrupt:
        print("[livox_detector] interrupted during start-up", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
