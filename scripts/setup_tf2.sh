#!/usr/bin/env bash
# Build TF for a pip-only machine: tf2_msgs, tf2 (C++), tf2_py (C extension) and tf2_ros_py (Python) from the upstream
# geometry2 sources in ../shared/ros2_upstream/geometry2.tar.gz, against the venv's ROS 2 Kilted wheels, into their own
# prefix (default <venv>/ros2_tf2), so that the node's TF features (output_frame, extrinsics and poses from TF) can be
# tested with the real tf2_ros Buffer / TransformListener / broadcasters. Like scripts/setup_ros_upstream.sh these are
# test tools: the venv's site-packages stay what requirements*.txt pin. A ROS 2 install has them already (tf2_ros).
#     source .venv/bin/activate && source .venv/ros2_tf2/setup.sh
#
# Usage: scripts/setup_tf2.sh [VENV_DIR [PREFIX]]        (called by scripts/setup.sh when the sources exist)
#   ROS_UPSTREAM_SOURCES   directory of the tarballs (default <repo>/../shared/ros2_upstream)
#   FORCE=1                rebuild even when the stamp says the prefix is current
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(cd "${1:-$REPO_ROOT/.venv}" && pwd)"
PREFIX="${2:-$VENV/ros2_tf2}"
SOURCES="${ROS_UPSTREAM_SOURCES:-$REPO_ROOT/../shared/ros2_upstream}"
BUILD="${TF2_BUILD_DIR:-$REPO_ROOT/build/ros2_tf2}"
PY="$VENV/bin/python"
FIX_INCLUDES="$REPO_ROOT/scripts/cmake/wheel_include_fix.cmake"
# tf2's find_package(ament_cmake_ros): a build-only stand-in (see the file), the wheel's test helpers need gtest/gmock
AMENT_CMAKE_ROS_DIR="$REPO_ROOT/scripts/cmake/ament_cmake_ros"

log() { printf '[setup_tf2] %s\n' "$*"; }
die() { printf '[setup_tf2] error: %s\n' "$*" >&2; exit 1; }

[ -x "$PY" ] || die "no Python at $PY (run scripts/setup.sh first)"
[ -f "$SOURCES/geometry2.tar.gz" ] || die "no geometry2 sources at $SOURCES/geometry2.tar.gz"
SOURCES="$(cd "$SOURCES" && pwd)"

inputs_hash() {
    {
        sha256sum "$SOURCES/geometry2.tar.gz" | cut -d' ' -f1
        cat "${BASH_SOURCE[0]}" "$FIX_INCLUDES" "$AMENT_CMAKE_ROS_DIR/ament_cmake_rosConfig.cmake"
        "$PY" --version
        echo "$VENV $PREFIX"
    } | sha256sum | cut -d' ' -f1
}

cmake_package() {  # configure, build, install one unmodified upstream CMake package into PREFIX
    local name="$1" src="$BUILD/src/geometry2/$1" build="$BUILD/$1" py_include numpy_include
    read -r py_include numpy_include < <("$PY" -c '
import sysconfig, numpy
print(sysconfig.get_paths()["include"], numpy.get_include())')
    log "building $name"
    mkdir -p "$build"
    (
        cd "$build"
        export PATH="$VENV/bin:$PATH"  # the rosidl generators are Python scripts: they must run in the venv
        export AMENT_PREFIX_PATH="$PREFIX:$VENV" CMAKE_PREFIX_PATH="$PREFIX;$VENV"
        export LD_LIBRARY_PATH="$PREFIX/lib:$VENV/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
        cmake "$src" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DCMAKE_PROJECT_INCLUDE="$FIX_INCLUDES" \
            -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_PREFIX_PATH="$PREFIX;$VENV" -Dament_cmake_ros_DIR="$AMENT_CMAKE_ROS_DIR" \
            -DCMAKE_INSTALL_RPATH="$PREFIX/lib;$VENV/lib" -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON \
            -DPython3_EXECUTABLE="$PY" -DPYTHON_EXECUTABLE="$PY" -DPython3_FIND_VIRTUALENV=ONLY \
            -DLOCAL_PYTHON_INCLUDE="$py_include" -DLOCAL_NUMPY_INCLUDE="$numpy_include" \
            >cmake-configure.log 2>&1 \
            || { tail -30 cmake-configure.log >&2; die "cmake configure of $name failed (log: $build/cmake-configure.log)"; }
        cmake --build . -j "$(nproc 2>/dev/null || echo 2)" >cmake-build.log 2>&1 \
            || { tail -30 cmake-build.log >&2; die "build of $name failed (log: $build/cmake-build.log)"; }
        cmake --install . >cmake-install.log 2>&1 || die "$name: install failed (log: $build/cmake-install.log)"
    )
}

write_environment() {
    cat >"$PREFIX/setup.sh" <<EOF
# Source after .venv/bin/activate: puts tf2_ros (built from upstream geometry2 into $PREFIX) on the paths.
# Written by scripts/setup_tf2.sh.
export PYTHONPATH="$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
export LD_LIBRARY_PATH="$PREFIX/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export AMENT_PREFIX_PATH="$PREFIX\${AMENT_PREFIX_PATH:+:\$AMENT_PREFIX_PATH}"
EOF
}

check_tf2() {
    local out
    out="$(cd / && env -i HOME="$HOME" PATH=/usr/bin:/bin bash -c \
        "source '$VENV/bin/activate' && source '$PREFIX/setup.sh' && python -c 'import tf2_ros, tf2_msgs.msg; tf2_ros.Buffer()'" 2>&1)" \
        || die "tf2_ros does not import: $out"
}

main() {
    local t0=$SECONDS want stamp="$PREFIX/.livox_infer_tf2"
    want="$(inputs_hash)"
    if [ -z "${FORCE:-}" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "$PREFIX is up to date"
        return 0
    fi
    rm -rf "$PREFIX" "$BUILD"
    mkdir -p "$PREFIX" "$BUILD/src"
    tar -xzf "$SOURCES/geometry2.tar.gz" -C "$BUILD/src"
    SITE="$("$PY" -c 'import sys, sysconfig; print(sysconfig.get_path("purelib", "posix_prefix", {"base": sys.argv[1], "platbase": sys.argv[1]}))' "$PREFIX")"
    cmake_package tf2_msgs
    cmake_package tf2
    cmake_package tf2_py
    log "pip install tf2_ros_py into $PREFIX"
    "$PY" -m pip install -qq --disable-pip-version-check --no-deps --ignore-installed --no-build-isolation \
        --prefix "$PREFIX" "$BUILD/src/geometry2/tf2_ros_py" >"$BUILD/pip.log" 2>&1 \
        || { tail -30 "$BUILD/pip.log" >&2; die "pip install of tf2_ros_py failed (log: $BUILD/pip.log)"; }
    write_environment
    check_tf2
    echo "$want" >"$stamp"
    log "ready: source $PREFIX/setup.sh ($((SECONDS - t0)) s)"
}

main "$@"
