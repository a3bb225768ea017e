#!/usr/bin/env bash
# Install the upstream ROS 2 command-line and launch tools (launch, launch_ros, ros2launch, ros2cli with its
# pkg/node/topic/param/run/service/interface verbs, rosidl_runtime_py, sensor_msgs_py, composition_interfaces)
# from the source snapshots in ../shared/ros2_upstream, so that the tests can run `ros2 launch livox_infer ...`,
# `ros2 param ...` and `ros2 topic ...` exactly as a ROS 2 user types them, on a pip-only machine.
#
# They are test tools, not dependencies of livox_infer: they go into their own prefix (default <venv>/ros2_upstream),
# never into the venv's site-packages, so the venv stays exactly what requirements*.txt pin.  Use them with
#     source .venv/bin/activate && source .venv/ros2_upstream/setup.sh
# The prefix also holds the type hashes of the full upstream vision_msgs (share/upstream_type_hashes/vision_msgs/),
# generated from the upstream package's own CMakeLists.txt, for the tests to compare the venv's vision_msgs with.
#
# Usage: scripts/setup_ros_upstream.sh [VENV_DIR [PREFIX]]      (called by scripts/setup.sh when the sources exist)
#   ROS_UPSTREAM_SOURCES   directory of the tarballs (default <repo>/../shared/ros2_upstream)
#   FORCE=1                reinstall even when the stamp says the prefix is current
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(cd "${1:-$REPO_ROOT/.venv}" && pwd)"
PREFIX="${2:-$VENV/ros2_upstream}"
SOURCES="${ROS_UPSTREAM_SOURCES:-$REPO_ROOT/../shared/ros2_upstream}"
BUILD="${ROS_UPSTREAM_BUILD_DIR:-$REPO_ROOT/build/ros2_upstream}"
PY="$VENV/bin/python"
FIX_INCLUDES="$REPO_ROOT/scripts/cmake/wheel_include_fix.cmake"

log() { printf '[setup_ros_upstream] %s\n' "$*"; }
die() { printf '[setup_ros_upstream] error: %s\n' "$*" >&2; exit 1; }

[ -x "$PY" ] || die "no Python at $PY (run scripts/setup.sh first)"
[ -d "$SOURCES" ] || die "no upstream sources at $SOURCES"
SOURCES="$(cd "$SOURCES" && pwd)"

# Install order from the sources' README (pip --no-deps: each package's ROS dependencies come before it).
PYTHON_PACKAGES=(
    launch/launch launch/launch_xml launch/launch_yaml launch_ros/launch_ros rosidl_runtime_py
    ros2cli/ros2cli ros2cli/ros2pkg ros2cli/ros2node ros2cli/ros2service ros2cli/ros2topic ros2cli/ros2param
    ros2cli/ros2run ros2cli/ros2interface launch_ros/ros2launch common_interfaces/sensor_msgs_py
)

inputs_hash() {
    {
        sha256sum "$SOURCES"/*.tar.gz | cut -d' ' -f1
        cat "$REPO_ROOT/requirements-ros-upstream.txt" "${BASH_SOURCE[0]}" "$FIX_INCLUDES"
        "$PY" --version
        echo "$VENV $PREFIX"
    } | sha256sum | cut -d' ' -f1
}

extract_sources() {
    rm -rf "$BUILD"
    mkdir -p "$BUILD/src"
    local t
    for t in "$SOURCES"/*.tar.gz; do
        tar -xzf "$t" -C "$BUILD/src"
    done
}

install_python_packages() {
    local pip=("$PY" -m pip install -qq --disable-pip-version-check --no-deps --ignore-installed --prefix "$PREFIX")
    log "pip install (PyPI, pinned) into $PREFIX: $(grep -v '^#' "$REPO_ROOT/requirements-ros-upstream.txt" | xargs)"
    "${pip[@]}" -r "$REPO_ROOT/requirements-ros-upstream.txt" || die "pip could not install requirements-ros-upstream.txt"
    local dirs=() p
    for p in "${PYTHON_PACKAGES[@]}"; do dirs+=("$BUILD/src/$p"); done
    log "pip install ${#PYTHON_PACKAGES[@]} upstream packages into $PREFIX"
    "${pip[@]}" --no-build-isolation "${dirs[@]}" >"$BUILD/pip.log" 2>&1 \
        || { tail -30 "$BUILD/pip.log" >&2; die "pip install of the upstream packages failed (log: $BUILD/pip.log)"; }
}

# cmake configure of an unmodified upstream interface package against the venv's ROS wheels; extra args go to cmake.
cmake_configure() {
    local src="$1" build="$2"
    shift 2
    local py_include numpy_include
    read -r py_include numpy_include < <("$PY" -c '
import sysconfig, numpy
print(sysconfig.get_paths()["include"], numpy.get_include())')
    mkdir -p "$build"
    (
        cd "$build"
        export PATH="$VENV/bin:$PATH"  # the rosidl generators are Python scripts: they must run in the venv
        export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV" LD_LIBRARY_PATH="$VENV/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        cmake "$src" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DCMAKE_PROJECT_INCLUDE="$FIX_INCLUDES" \
            -DPython3_EXECUTABLE="$PY" -DPYTHON_EXECUTABLE="$PY" -DPython3_FIND_VIRTUALENV=ONLY \
            -DLOCAL_PYTHON_INCLUDE="$py_include" -DLOCAL_NUMPY_INCLUDE="$numpy_include" "$@" \
            >cmake-configure.log 2>&1 \
            || { tail -30 cmake-configure.log >&2; die "cmake configure of $src failed (log: $build/cmake-configure.log)"; }
    )
}

cmake_build() {
    local build="$1"
    shift
    (cd "$build" && PATH="$VENV/bin:$PATH" LD_LIBRARY_PATH="$VENV/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        cmake --build . -j "$(nproc 2>/dev/null || echo 2)" "$@" >cmake-build.log 2>&1) \
        || { tail -30 "$build/cmake-build.log" >&2; die "build in $build failed (log: $build/cmake-build.log)"; }
}

# launch_ros imports composition_interfaces (srv only, not a wheel): built from its upstream CMakeLists.txt.
build_composition_interfaces() {
    local build="$BUILD/composition_interfaces"
    log "building composition_interfaces into $PREFIX"
    cmake_configure "$BUILD/src/rcl_interfaces/composition_interfaces" "$build" -DCMAKE_INSTALL_PREFIX="$PREFIX"
    cmake_build "$build"
    (cd "$build" && cmake --install . >cmake-install.log 2>&1) || die "composition_interfaces: install failed"
}

# The RIHS01 type hashes of the full upstream vision_msgs, from its own build (only the type-description
# step: no compiled code, nothing installed that could shadow the venv's vision_msgs).
upstream_vision_msgs_hashes() {
    local build="$BUILD/vision_msgs"
    log "computing the upstream vision_msgs type hashes"
    cmake_configure "$BUILD/src/vision_msgs/vision_msgs" "$build"
    cmake_build "$build" --target vision_msgs__rosidl_generator_type_description
    local out="$PREFIX/share/upstream_type_hashes/vision_msgs"
    mkdir -p "$out"
    cp "$build"/rosidl_generator_type_description/vision_msgs/msg/*.json "$out/"
}

write_environment() {
    local site
    site="$("$PY" -c 'import sys, sysconfig; print(sysconfig.get_path("purelib", "posix_prefix", {"base": sys.argv[1], "platbase": sys.argv[1]}))' "$PREFIX")"
    cat >"$PREFIX/setup.sh" <<EOF
# Source after .venv/bin/activate: puts the upstream ROS 2 tools of $PREFIX (ros2, launch, ...) on the paths.
# Written by scripts/setup_ros_upstream.sh.
export PATH="$PREFIX/bin:$VENV/bin\${PATH:+:\$PATH}"
export PYTHONPATH="$site\${PYTHONPATH:+:\$PYTHONPATH}"
export LD_LIBRARY_PATH="$PREFIX/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
# the venv's ament index (livox_infer) last: an overlay already on AMENT_PREFIX_PATH keeps precedence
case ":\${AMENT_PREFIX_PATH:-}:" in *":$VENV:"*) ;; *) export AMENT_PREFIX_PATH="\${AMENT_PREFIX_PATH:+\$AMENT_PREFIX_PATH:}$VENV" ;; esac
export AMENT_PREFIX_PATH="$PREFIX:\$AMENT_PREFIX_PATH"
EOF
}

check_tools() {
    # From / with a clean environment: what a user gets from `source .venv/bin/activate; source <prefix>/setup.sh`.
    local out
    out="$(cd / && env -i HOME="$HOME" PATH=/usr/bin:/bin bash -c \
        "source '$VENV/bin/activate' && source '$PREFIX/setup.sh' && ros2 pkg prefix livox_infer && python -c 'import launch_ros, composition_interfaces.srv, sensor_msgs_py'" 2>&1)" \
        || die "the installed tools do not run: $out"
}

main() {
    local t0=$SECONDS want stamp="$PREFIX/.livox_infer_ros_upstream"
    want="$(inputs_hash)"
    if [ -z "${FORCE:-}" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "$PREFIX is up to date"
        return 0
    fi
    rm -rf "$PREFIX"
    mkdir -p "$PREFIX"
    extract_sources
    install_python_packages
    build_composition_interfaces
    upstream_vision_msgs_hashes
    write_environment
    check_tools
    echo "$want" >"$stamp"
    log "ready: source $PREFIX/setup.sh ($((SECONDS - t0)) s)"
}

main "$@"
