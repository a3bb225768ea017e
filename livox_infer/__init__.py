"""livox_infer: real-time 3D object detection for Livox LiDARs.

The ROS-free core (decode -> filter -> voxelize -> network -> boxes) lives in this
package; ``livox_infer.ros.node`` is the thin rclpy layer on top.
"""

__version__ = "0.1.0"

CLASS_NAMES = ("car", "pedestrian", "cyclist", "truck", "bus")

# torch.compile's cache goes to livox_infer's one cache folder (livox_infer/cache.py), set before torch is imported
# by any livox_infer module: importing inductor otherwise writes its /tmp default into the environment first.
from livox_infer.cache import inductor_cache_dir as _inductor_cache_dir  # noqa: E402

_inductor_cache_dir()
