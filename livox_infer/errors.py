"""Typed errors of the ROS-free core. Callers (the node, the CLI) catch these and report them."""


class LivoxInferError(Exception):
    """Base class of every error this package raises on purpose."""


class PointCloudError(LivoxInferError, ValueError):
    """A point cloud message or file is malformed or uses an unsupported layout."""


class ConfigError(LivoxInferError, ValueError):
    """A model config, grid config or parameter value is invalid."""


class WeightsError(LivoxInferError):
    """Model weights are missing, corrupt or do not match their config."""


class BackendError(LivoxInferError, RuntimeError):
    """A requested compute backend (e.g. cuda) is not available."""
