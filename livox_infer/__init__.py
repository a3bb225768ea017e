"""livox_infer: real-time 3D object detection for Livox LiDARs.

The ROS-free core (decode -> filter -> voxelize -> network -> boxes) lives in this
package; ``livox_infer.ros.node`` is the thin rclpy layer on top.
"""

__version__ = "0.1.0"

CLASS_NAMES = ("car", "pedestrian", "cyclist")
