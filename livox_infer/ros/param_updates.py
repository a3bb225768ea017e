"""rclpy parameter glue of the detector node: what a user types is taken as meant, and a change of several
parameters is one change.

* ``max_range:=80`` / ``ros2 param set ... max_range 80`` arrive as INTEGER; rclpy would refuse them for a double
  parameter ("Wrong parameter type, expected '3' got '2'"), so they become the double they obviously mean.
* rclpy's ``set_parameters`` service (``ros2 param load``, ``AsyncParameterClient.set_parameters``) applies a request
  one parameter at a time: moving the ROI from x 0..80 to 90..150 refused 90..80 and then applied 0..150. Here the
  whole request is validated and applied at once (as ``set_parameters_atomically``), or nothing changes and every
  parameter of it reports the reason. Entries equal to the current value are left out first, so loading a preset
  YAML that repeats a read-only parameter (``sensor``) still works.
"""

from __future__ import annotations

from typing import Any

from rcl_interfaces.msg import SetParametersResult
from rclpy.exceptions import ParameterException
from rclpy.parameter import Parameter


def integers_as_doubles(double_names: frozenset[str]):
    """A pre-set-parameters callback: INTEGER values of the parameters in ``double_names`` become DOUBLE."""

    def convert(params: list[Parameter]) -> list[Parameter]:
        return [Parameter(p.name, Parameter.Type.DOUBLE, float(p.value))
                if p.name in double_names and p.type_ == Parameter.Type.INTEGER else p for p in params]

    return convert


def serve_set_parameters_as_one_change(node) -> bool:
    """Make ``node``'s ``~/set_parameters`` service apply each request as a whole; False when the node has no
    parameter services (``start_parameter_services=False``)."""
    # rclpy's ParameterService names it "<node name>/set_parameters" (relative, resolved in the node's namespace)
    service = next((s for s in node.services if s.srv_name.rsplit("/", 1)[-1] == "set_parameters"), None)
    if service is None:
        return False

    def set_parameters(request, response):
        params = [Parameter.from_parameter_msg(p) for p in request.parameters]
        result = set_as_one_change(node, params)
        response.results = [result] * len(params)
        return response

    service.callback = set_parameters
    return True


def set_as_one_change(node, params: list[Parameter]) -> SetParametersResult:
    """Set ``params`` together (all or nothing); values equal to the current ones are not set again."""
    changes = [p for p in params if not _unchanged(node, p)]
    if not changes:
        return SetParametersResult(successful=True, reason="unchanged")
    try:
        return node.set_parameters_atomically(changes)
    except ParameterException as exc:  # undeclared name, ...
        return SetParametersResult(successful=False, reason=str(exc))


def _unchanged(node, param: Parameter) -> bool:
    if not node.has_parameter(param.name):
        return False
    current: Any = node.get_parameter(param.name).value
    value = param.value
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return type(current) is type(value) and current == value
