#!/usr/bin/env bash
# Set up livox_infer in a Python venv (`make setup`): system packages, .venv with the pinned
# requirements (CPU torch, Triton, ROS 2 Kilted wheels), this package (editable) with the ROS
# install layout, and the vision_msgs / livox_ros_driver2 interface packages.  Idempotent: each step is skipped when its
# stamp or check says it is done, so a second run takes seconds.
#
# Environment:
#   LIVOX_INFER_VENV   venv directory (default: <repo>/.venv)
#   PYTHON             interpreter that creates the venv (default: python3.11, else python3; needs >= 3.10)
#   SKIP_APT=1         do not touch system packages (they must be there already)
#   FORCE=1            redo every step
#   SKIP_PACKAGES=1    do not build the AOTInductor packages (scripts/build_packages.sh; `make package` later)
#   ROS_UPSTREAM_SOURCES  upstream ROS 2 tool sources for the tests (default <repo>/../shared/ros2_upstream)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LIVOX_INFER_VENV:-$REPO_ROOT/.venv}"
STAMPS="$VENV/.livox_infer_setup"
MIN_FREE_GB=4   # free disk the first pip install needs beside the venv
cd "$REPO_ROOT"

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }
stamp_ok() { [ -z "${FORCE:-}" ] && [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp_set() { mkdir -p "$STAMPS"; echo "$2" >"$STAMPS/$1"; }

# ---------------------------------------------------------------- 1. system packages (Debian/Ubuntu)
# g++/make/python headers: torch.compile's C++ backend (Inductor) and the vision_msgs build;
# cmake: vision_msgs; libusb-1.0-0 + libgomp1: open3d; python3-venv: venvs from Debian's python3.
APT_PACKAGES=(g++ gcc make cmake python3-dev python3-venv libusb-1.0-0 libgomp1)
install_system_packages() {
    if [ -n "${SKIP_APT:-}" ] || ! command -v dpkg-query >/dev/null; then
        command -v dpkg-query >/dev/null || log "not a Debian/Ubuntu system: install a C++ compiler, cmake, Python headers and libusb-1.0 yourself"
        return 0
    fi
    local missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null && sudo -n true 2>/dev/null \
            || die "missing system packages: ${missing[*]} (run as root: apt-get install ${missing[*]}, or set SKIP_APT=1)"
        sudo=(sudo -n)
    fi
    log "apt-get install ${missing[*]}"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ---------------------------------------------------------------- 2. venv
pick_python() {
    if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
    for c in python3.11 python3; do
        command -v "$c" >/dev/null && { echo "$c"; return; }
    done
    die "no python3 found (apt-get install python3 python3-venv)"
}
create_venv() {
    if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
        return 0
    fi
    local py; py="$(pick_python)"
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$py is older than Python 3.10"
    log "creating $VENV with $("$py" --version)"
    rm -rf "$VENV"
    "$py" -m venv "$VENV" || die "could not create the venv (Debian: apt-get install python3-venv)"
}

# ---------------------------------------------------------------- 3. pinned requirements
install_requirements() {
    local want; want="$( { cat requirements.txt requirements-ros-build.txt requirements-ray.txt; "$VENV/bin/python" --version; } | sha256sum | cut -d' ' -f1)"
    stamp_ok requirements "$want" && return 0
    # The installed venv is ~2.7 GB and pip unpacks wheels beside it: a full disk otherwise surfaces as a
    # bare "[Errno 28]" from pip followed by the wheel-index hint below, which sends one looking in the wrong place.
    local free_kb; free_kb="$(df -Pk "$VENV" 2>/dev/null | awk 'NR==2 {print $4}')"
    if [ -n "$free_kb" ] && [ "$free_kb" -lt $((MIN_FREE_GB * 1024 * 1024)) ]; then
        die "only $((free_kb / 1024)) MB free at $VENV; the pinned requirements need about ${MIN_FREE_GB} GB (free some disk, or set LIVOX_INFER_VENV to a roomier place)"
    fi
    log "pip install -r requirements.txt -r requirements-ros-build.txt -r requirements-ray.txt (CPU torch; first run takes a few minutes)"
    # torch==X+cpu is only found in a local wheel directory or PyTorch's CPU wheel index (PIP_EXTRA_INDEX_URL),
    # never on the default index: a missing CPU wheel fails here instead of pulling the CUDA build.
    "$VENV/bin/python" -m pip install -qq --disable-pip-version-check setuptools==84.2.1 \
        || die "pip could not install setuptools"
    "$VENV/bin/python" -m pip install -qq --disable-pip-version-check \
        -r requirements.txt -r requirements-ros-build.txt -r requirements-ray.txt \
        || die "pip install failed (read pip's error above; a missing torch==2.13.0+cpu wheel needs PyTorch's CPU wheel index as PIP_EXTRA_INDEX_URL, see docs/install.md)"
    stamp_set requirements "$want"
}

# ---------------------------------------------------------------- 4. this package
install_package() {
    local want; want="$(hash_of setup.py setup.cfg package.xml)"
    local where
    # Run from / so that the checkout itself (cwd) does not make the package importable.
    where="$(cd / && "$VENV/bin/python" -c 'import livox_infer, os; print(os.path.dirname(os.path.realpath(livox_infer.__file__)))' 2>/dev/null || true)"
    if [ "$where" = "$REPO_ROOT/livox_infer" ] && [ -x "$VENV/bin/livox-infer" ] && stamp_ok package "$want"; then
        return 0
    fi
    log "pip install -e . (editable: source edits take effect at once)"
    "$VENV/bin/python" -m pip install -qq --disable-pip-version-check --no-deps --no-build-isolation -e . \
        || die "pip install -e . failed"
    stamp_set package "$want"
}

# An editable install installs no data_files, so lay out what `pip install .` (and colcon) would install,
# linked into the source tree: the ament index marker, share/livox_infer/{package.xml,launch,config,schema,models,rviz}
# and lib/livox_infer/detector_node, where `ros2 run`/`ros2 launch` and ament_index_python look.
# launch/config/models are real directories of per-file links: ros2launch finds launch files with os.walk,
# which does not enter symlinked directories (a directory link made `ros2 launch livox_infer ...` fail).
# Rebuilt on every setup, so files added to the source tree appear after the next `make setup`.
link_ros_layout() {
    local share="$VENV/share/livox_infer"
    mkdir -p "$share" "$VENV/share/ament_index/resource_index/packages" "$VENV/lib/livox_infer"
    cp resource/livox_infer "$VENV/share/ament_index/resource_index/packages/livox_infer"
    ln -sfn "$REPO_ROOT/package.xml" "$share/package.xml"
    for item in launch config schema models rviz; do
        rm -rf "${share:?}/$item"
        cp -rs "$REPO_ROOT/$item" "$share/$item"
    done
    install -m 0755 resource/detector_node "$VENV/lib/livox_infer/detector_node"
    # `source .venv/bin/activate` must find the ament index without further exports
    local marker="# livox_infer: ament index of this venv"
    if ! grep -qF "$marker" "$VENV/bin/activate"; then
        printf '\n%s\ncase ":${AMENT_PREFIX_PATH:-}:" in *":$VIRTUAL_ENV:"*) ;; *) export AMENT_PREFIX_PATH="$VIRTUAL_ENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}" ;; esac\n' \
            "$marker" >> "$VENV/bin/activate"
    fi
}

# ---------------------------------------------------------------- 5. interface packages
# vision_msgs (the node's output) and livox_ros_driver2 (CustomMsg input) are not published as wheels.
build_interfaces() {
    bash "$REPO_ROOT/scripts/build_interfaces.sh" "$VENV" vision_msgs livox_ros_driver2 livox_infer_msgs
}

# ---------------------------------------------------------------- 6. upstream ROS 2 tools for the tests (optional)
# ros2 launch / param / topic and sensor_msgs_py are not on PyPI: their sources ship in ../shared/ros2_upstream, and
# they go into their own prefix (<venv>/ros2_upstream), not into the venv (test tools, not livox_infer dependencies).
install_ros_upstream_tools() {
    local sources="${ROS_UPSTREAM_SOURCES:-$REPO_ROOT/../shared/ros2_upstream}"
    if [ ! -d "$sources" ]; then
        log "no $sources: the tests that run ros2 launch/param/topic will skip"
        return 0
    fi
    bash "$REPO_ROOT/scripts/setup_ros_upstream.sh" "$VENV"
    # tf2_msgs, tf2, tf2_py, tf2_ros_py from upstream geometry2 (<venv>/ros2_tf2): the node's TF features, tested live
    if [ -f "$sources/geometry2.tar.gz" ]; then
        bash "$REPO_ROOT/scripts/setup_tf2.sh" "$VENV"
    fi
}

# ---------------------------------------------------------------- 7. AOTInductor packages for this machine
# The node and detect start from these in about a second instead of compiling (docs/performance.md, Start-up);
# a failure here is reported and setup goes on (the pipeline then uses torch.compile).
build_packages() {
    if [ -n "${SKIP_PACKAGES:-}" ]; then
        log "SKIP_PACKAGES set: no AOTInductor packages (make package builds them later)"
        return 0
    fi
    bash "$REPO_ROOT/scripts/build_packages.sh" "$VENV" || log "some AOTInductor packages were not built (see above)"
}

check_environment() {
    # From / so that livox_infer must come from the install, not from the current directory.
    (cd / && "$VENV/bin/python" - <<'EOF') || die "the venv does not import what livox_infer needs (see above)"
import importlib
for name in ("torch", "triton", "numpy", "rosbags", "safetensors", "yaml", "rclpy", "sensor_msgs.msg",
             "visualization_msgs.msg", "diagnostic_msgs.msg", "nav_msgs.msg", "vision_msgs.msg", "livox_ros_driver2.msg",
             "ray", "livox_infer"):
    importlib.import_module(name)
EOF
}

main() {
    local t0=$SECONDS
    install_system_packages
    mkdir -p "$(dirname "$VENV")"
    create_venv
    mkdir -p "$STAMPS"
    # Serialise concurrent runs (several shells may call `make test` at once).
    exec 9>"$STAMPS/lock"
    command -v flock >/dev/null && flock 9
    install_requirements
    install_package
    link_ros_layout
    build_interfaces
    check_environment
    install_ros_upstream_tools
    build_packages
    log "ready: $VENV ($((SECONDS - t0)) s)"
}

main "$@"
