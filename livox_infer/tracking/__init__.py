"""Tracking after the detector (ROS-free): stable ids, velocities and yaw rates (livox_infer/tracking/tracker.py)."""

from livox_infer.tracking.tracker import TrackFrame, Tracker, TrackerConfig, candidates_of

__all__ = ["TrackFrame", "Tracker", "TrackerConfig", "candidates_of"]
