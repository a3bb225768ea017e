"""Livox scan simulator: scan patterns of the five Livox models, procedural street/open scenes with
labelled cars, pedestrians and cyclists, vectorised ray casting, and ground truth in the sensor frame.

See docs/simulator.md.
"""

from livox_infer.sim.scene import SCENE_MODES, Scene, SceneObject, make_scene
from livox_infer.sim.sensors import SENSORS, SensorModel, dirs_to_angles, get_sensor
from livox_infer.sim.simulate import SimFrame, iter_drive, simulate_drive, simulate_frame

__all__ = [
    "SENSORS", "SCENE_MODES", "Scene", "SceneObject", "SensorModel", "SimFrame", "dirs_to_angles", "get_sensor",
    "iter_drive",
    "make_scene", "simulate_drive", "simulate_frame",
]
