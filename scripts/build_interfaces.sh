#!/usr/bin/env bash
# Build ROS 2 interface packages from livox_infer/interfaces/<package>/msg/*.msg and install them into a
# Python venv that holds the ROS 2 wheels (ros-rclpy, ros-std-msgs, ...).
#
#   vision_msgs        the whole upstream message set (the node publishes Detection3DArray): a partial set broke
#                      overlays of a full vision_msgs ("undefined symbol"). Not published as a wheel.
#   livox_ros_driver2  CustomMsg/CustomPoint: the Livox driver's native cloud, so the node can subscribe to it
#                      in a pip-only environment (the driver itself is built from source on a ROS install).
#   livox_infer_msgs   this project's own TrackedObject/TrackedObjects (the node's ~/tracked_objects, docs/tracking.md).
#
# The vision_msgs and livox_ros_driver2 .msg files keep the upstream field layouts exactly, so the generated types
# carry the upstream RIHS01 type hashes and interoperate with real publishers/subscribers.
# A package that is already importable from outside the venv (a sourced ROS install) is not built.
#
# Usage: scripts/build_interfaces.sh [VENV_DIR [PACKAGE...]]   (default: <repo>/.venv, all three packages)
#        FORCE=1 ...                                           rebuild even when the stamp says it is current
#        INTERFACES_PREFIX=DIR ...                             install there instead of into the venv (an overlay)
# Needs: cmake, a C/C++ compiler, Python headers, and the build wheels of requirements-ros-build.txt.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(cd "${1:-$REPO_ROOT/.venv}" && pwd)"
shift || true
PACKAGES=("$@")
[ ${#PACKAGES[@]} -gt 0 ] || PACKAGES=(vision_msgs livox_ros_driver2 livox_infer_msgs)
PY="$VENV/bin/python"
PREFIX="${INTERFACES_PREFIX:-$VENV}"
BUILD_ROOT="${INTERFACES_BUILD_DIR:-$REPO_ROOT/build/interfaces}"

log() { printf '[build_interfaces] %s\n' "$*"; }
die() { printf '[build_interfaces] error: %s\n' "$*" >&2; exit 1; }

[ -x "$PY" ] || die "no Python at $PY (create the venv first: scripts/setup.sh)"

declare -A VERSION=([vision_msgs]=4.1.1 [livox_ros_driver2]=1.0.0 [livox_infer_msgs]=1.0.0)
declare -A DESCRIPTION=(
    [vision_msgs]="vision_msgs 4.x (all 16 messages), built by livox_infer for pip-only ROS 2 environments."
    [livox_ros_driver2]="Livox CustomMsg/CustomPoint (livox_ros_driver2 layout), built by livox_infer for pip-only ROS 2 environments."
    [livox_infer_msgs]="livox_infer's tracked-object messages (TrackedObject, TrackedObjects)."
)

# site-packages of an INTERFACES_PREFIX overlay, for PYTHONPATH (nothing to add for the venv itself)
prefix_site_packages() {
    [ "$PREFIX" != "$VENV" ] || return 0
    "$PY" -c 'import sys, sysconfig; print(sysconfig.get_path("purelib", "posix_prefix", {"base": sys.argv[1], "platbase": sys.argv[1]}))' "$PREFIX"
}

tools_checked=""
check_tools() {
    [ -n "$tools_checked" ] && return 0
    local tool
    for tool in cmake c++ cc; do
        command -v "$tool" >/dev/null || die "'$tool' not found (apt-get install cmake g++)"
    done
    local tool_pkg
    for tool_pkg in ament_cmake rosidl_default_generators python_cmake_module fastrtps_cmake_module; do
        [ -d "$VENV/share/$tool_pkg/cmake" ] \
            || die "$tool_pkg CMake files missing in $VENV/share (pip install -r requirements-ros-build.txt)"
    done
    # Local Python and numpy include directories.  The wheels' exported CMake targets name the include
    # directories of the machine that built them (/opt/python/cp3XX-cp3XX/...); CMake refuses imported
    # targets whose include directories do not exist, so the generated CMakeLists.txt rewrites them.
    read -r PY_INCLUDE NUMPY_INCLUDE < <("$PY" -c '
import sysconfig, numpy
print(sysconfig.get_paths()["include"], numpy.get_include())')
    [ -f "$PY_INCLUDE/Python.h" ] || die "Python headers missing ($PY_INCLUDE/Python.h): apt-get install python3-dev"
    tools_checked=1
}

build_package() {
    local pkg="$1"
    local msg_dir="$REPO_ROOT/livox_infer/interfaces/$pkg/msg"
    local build_dir="$BUILD_ROOT/$pkg"
    local stamp="$PREFIX/share/$pkg/livox_infer_build.stamp"
    [ -n "${VERSION[$pkg]:-}" ] || die "unknown interface package '$pkg' (known: ${!VERSION[*]})"
    local messages=()
    local f
    for f in "$msg_dir"/*.msg; do messages+=("$(basename "$f" .msg)"); done
    [ -f "$msg_dir/${messages[0]}.msg" ] || die "no .msg files in $msg_dir"

    # 1. Provided from elsewhere (a sourced ROS install)?  Then it wins and nothing is built.
    local existing
    existing="$(cd / && PYTHONPATH="$(prefix_site_packages)${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "
import os, $pkg.msg
print(os.path.realpath(os.path.dirname($pkg.__file__)))" 2>/dev/null || true)"
    if [ -n "$existing" ] && [[ "$existing" != "$(realpath "$PREFIX")"/* ]] && [[ "$existing" != "$(realpath "$VENV")"/* ]]; then
        log "$pkg already provided by $existing (ROS install); nothing to build"
        return 0
    fi

    # 2. Up to date?  The stamp holds a hash of the inputs (messages, this script, Python and rosidl versions).
    local inputs_hash
    inputs_hash="$( { cat "$msg_dir"/*.msg "${BASH_SOURCE[0]}" $(ls "$msg_dir"/../package.xml "$msg_dir"/../CMakeLists.txt 2>/dev/null) "$REPO_ROOT/scripts/cmake/wheel_include_fix.cmake"
                      "$PY" -c '
import sys, importlib.metadata as md
print(sys.version)
print(sorted((d.metadata["Name"].lower(), d.version) for d in md.distributions()
             if d.metadata["Name"].lower().startswith(("ros-rosidl", "ros-std-msgs", "ros-geometry-msgs"))))' 
                    } | sha256sum | cut -d' ' -f1 )"
    if [ -z "${FORCE:-}" ] && [ -n "$existing" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs_hash" ]; then
        log "$pkg in $VENV is up to date"
        return 0
    fi

    check_tools
    # Interface packages this one refers to (std_msgs/Header -> std_msgs): all must come from the ROS wheels.
    local deps=()
    mapfile -t deps < <(sed 's/#.*//' "$msg_dir"/*.msg | grep -oE '^\s*[a-z][a-z0-9_]*/[A-Z]' \
                        | sed -E 's#^\s*([a-z0-9_]+)/.*#\1#' | sort -u | grep -vx "$pkg")  # own types are no dependency
    for f in "${deps[@]}"; do
        [ -d "$VENV/share/$f/cmake" ] || die "$pkg needs $f, whose CMake files are missing in $VENV/share (pip install ros-${f//_/-})"
    done
    local t0=$SECONDS
    log "building $pkg (${messages[*]}) into $PREFIX"
    rm -rf "$build_dir"
    mkdir -p "$build_dir/src/msg" "$build_dir/build"
    cp "$msg_dir"/*.msg "$build_dir/src/msg/"

    if [ -f "$msg_dir/../package.xml" ] && [ -f "$msg_dir/../CMakeLists.txt" ]; then
        # A package of our own ships its ament files (colcon builds the same folder on a ROS install).
        cp "$msg_dir/../package.xml" "$msg_dir/../CMakeLists.txt" "$build_dir/src/"
    else
    {
        cat <<EOF
<?xml version="1.0"?>
<package format="3">
  <name>$pkg</name>
  <version>${VERSION[$pkg]}</version>
  <description>${DESCRIPTION[$pkg]}</description>
  <maintainer email="livox-infer@example.com">livox_infer developers</maintainer>
  <license>Apache-2.0</license>
  <buildtool_depend>ament_cmake</buildtool_depend>
  <buildtool_depend>rosidl_default_generators</buildtool_depend>
EOF
        for d in "${deps[@]}"; do echo "  <depend>$d</depend>"; done
        cat <<'EOF'
  <exec_depend>rosidl_default_runtime</exec_depend>
  <member_of_group>rosidl_interface_packages</member_of_group>
  <export>
    <build_type>ament_cmake</build_type>
  </export>
</package>
EOF
    } >"$build_dir/src/package.xml"

    {
        cat <<EOF
cmake_minimum_required(VERSION 3.16)
project($pkg)
find_package(ament_cmake REQUIRED)
find_package(rosidl_default_generators REQUIRED)
EOF
        for d in "${deps[@]}"; do echo "find_package($d REQUIRED)"; done
        cat <<'EOF'

# Point the wheels' imported targets at this machine's Python/numpy headers.
include("${WHEEL_INCLUDE_FIX}")

rosidl_generate_interfaces(${PROJECT_NAME}
EOF
        for m in "${messages[@]}"; do printf '  "msg/%s.msg"\n' "$m"; done
        [ ${#deps[@]} -gt 0 ] && echo "  DEPENDENCIES ${deps[*]}"
        cat <<'EOF'
)
ament_export_dependencies(rosidl_default_runtime)
ament_package()
EOF
    } >"$build_dir/src/CMakeLists.txt"
    fi

    local jobs
    jobs="$(nproc 2>/dev/null || echo 2)"
    (
        cd "$build_dir/build"
        # The generators are Python scripts run by CMake: they must run in the venv.
        export PATH="$VENV/bin:$PATH"
        export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
        export CMAKE_PREFIX_PATH="$VENV${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
        export LD_LIBRARY_PATH="$VENV/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        cmake ../src -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
            -DCMAKE_INSTALL_PREFIX="$PREFIX" -DWHEEL_INCLUDE_FIX="$REPO_ROOT/scripts/cmake/wheel_include_fix.cmake" \
            -DPython3_EXECUTABLE="$PY" -DPYTHON_EXECUTABLE="$PY" -DPython3_FIND_VIRTUALENV=ONLY \
            -DLOCAL_PYTHON_INCLUDE="$PY_INCLUDE" -DLOCAL_NUMPY_INCLUDE="$NUMPY_INCLUDE" \
            >cmake-configure.log 2>&1 \
            || { tail -40 cmake-configure.log >&2; die "$pkg: cmake configure failed (log: $PWD/cmake-configure.log)"; }
        cmake --build . -j "$jobs" >cmake-build.log 2>&1 \
            || { tail -40 cmake-build.log >&2; die "$pkg: build failed (log: $PWD/cmake-build.log)"; }
        cmake --install . >cmake-install.log 2>&1 \
            || { tail -40 cmake-install.log >&2; die "$pkg: install failed (log: $PWD/cmake-install.log)"; }
    )

    # 3. The installed types must import and carry type support before the stamp says "done".
    (cd / && PYTHONPATH="$(prefix_site_packages)${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PY" -c "
import $pkg.msg as m
from rclpy.type_support import check_for_type_support
for name in '${messages[*]}'.split():
    check_for_type_support(getattr(m, name))
") || die "built $pkg does not import"
    echo "$inputs_hash" >"$stamp"
    log "$pkg done ($((SECONDS - t0)) s)"
}

for pkg in "${PACKAGES[@]}"; do
    build_package "$pkg"
done
