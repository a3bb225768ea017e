"""ament_python package setup. Works under colcon and with plain pip (see README)."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "livox_infer"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
        (f"share/{PACKAGE}/models", glob("models/*.yaml") + glob("models/*.safetensors")),
    ],
    install_requires=["setuptools", "numpy", "pyyaml"],
    zip_safe=True,
    maintainer="livox_infer developers",
    maintainer_email="livox-infer@example.com",
    description="Real-time 3D object detection for Livox LiDARs",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "livox-infer = livox_infer.cli:main",
            "detector_node = livox_infer.node:main",
        ],
    },
)
