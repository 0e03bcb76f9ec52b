"""Install the ``testbed`` package and its ``testbed`` console command.

Pinned dependency versions live in ``requirements.lock`` (installed by ``install.sh``);
``install_requires`` here names what the package imports, without pins, so that
``pip install -e .`` never fights the lock file.
"""

from setuptools import find_packages, setup

setup(
    name="aset-testbed",
    version="0.1.0",
    description="Network-emulation testbed for scheduling DNN inference on edge clusters (ASET)",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["testbed", "testbed.*"]),
    install_requires=[
        "pydantic>=2",
        "PyYAML",
        "networkx",
        "topohub",
        "aiohttp",
        "orjson",
        "simplejpeg",
        "pillow",
        "rich",
        "pandas",
        "pyarrow",
        "tabulate",
        "numpy",
        "scipy",
        "matplotlib",
        "gymnasium",
        "scapy",
        "dpkt",
        "ray",
        "psutil",
        "ai-edge-litert",
        "tensorflow-cpu",
    ],
    # optional: the Stable-Baselines3 peer check of ASET (benchmarks/aset_sb3.py, docs/aset.md);
    # torch 2.13.0 resolves to its CPU build here (2.13.0+cpu)
    # optional: the peer check's DQN (docs/aset.md, "A peer check"), and the TensorBoard viewer
    extras_require={"peer": ["stable-baselines3==2.9.2", "torch==2.13.0"], "tensorboard": ["tensorboard==2.21.0"]},
    entry_points={"console_scripts": ["testbed=testbed.cli.main:main"]},
)
