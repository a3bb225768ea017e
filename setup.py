"""ament_python package setup: works under colcon (ROS install) and with plain pip (venv).

colcon: setup.cfg puts the console scripts in <prefix>/lib/livox_infer/ (where `ros2 run` looks);
        data_files put launch/, config/, schema/, models/, rviz/ and package.xml in <prefix>/share/livox_infer/.
pip:    console scripts go to <prefix>/bin/ (`livox-infer` on PATH); a small wrapper
        (resource/detector_node) is added as <prefix>/lib/livox_infer/detector_node so the ROS tools
        find the node in a venv too.  An editable install (`pip install -e .`) installs no data_files:
        scripts/setup.sh writes the same layout as links into the source tree (see docs/install.md).
"""

import sys
from glob import glob

from setuptools import find_packages, setup

PACKAGE = "livox_infer"

data_files = [
    ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
    (f"share/{PACKAGE}", ["package.xml"]),
    (f"share/{PACKAGE}/launch", sorted(glob("launch/*.py"))),
    (f"share/{PACKAGE}/config", sorted(glob("config/*.yaml"))),
    (f"share/{PACKAGE}/config/rigs", sorted(glob("config/rigs/*.yaml"))),
    (f"share/{PACKAGE}/rviz", sorted(glob("rviz/*.rviz") + glob("rviz/*.json"))),
    (f"share/{PACKAGE}/schema", sorted(glob("schema/*.json"))),  # JSON schema of the parameter files
    (f"share/{PACKAGE}/models", sorted(glob("models/*.yaml") + glob("models/*.safetensors"))),
]
# Only for pip's wheel build: under colcon the console script itself is installed at that path
# (setup.cfg), and two writers of one file would race.
if "bdist_wheel" in sys.argv:
    data_files.append((f"lib/{PACKAGE}", ["resource/detector_node"]))

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    # Message definitions (vision_msgs, livox CustomMsg) that bag I/O registers at run time.
    package_data={PACKAGE: ["interfaces/**/*.msg"]},
    data_files=data_files,
    python_requires=">=3.10",
    # torch, triton, rosbags, safetensors and the ROS 2 wheels are pinned in requirements.txt and installed by
    # scripts/setup.sh (torch must be the CPU/CUDA build the user chooses, never an unpinned default).
    install_requires=["setuptools", "numpy", "pyyaml"],
    # `livox-infer detect --out-dir ... --ray`: same pin as requirements-ray.txt (test_packaging checks)
    extras_require={"ray": ["ray==2.60.0"]},
    zip_safe=False,
    maintainer="livox_infer developers",
    maintainer_email="livox-infer@example.com",
    description="Real-time 3D object detection for Livox LiDARs",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "livox-infer = livox_infer.tools.cli:main",
            "detector_node = livox_infer.ros.entry:main",
        ],
    },
)
