"""Install the ``testbed`` package and its ``testbed`` console command.

Pinned dependency versions live in ``requirements.lock`` (installed by ``install.sh``);
``install_requires`` here names what the package imports, without pins, so that
``pip install -e .`` never fights the lock file.

What an installed copy (``pip install .``, a wheel) reads at run time:

* inside the package: its code, and the Ryu app, copied at build time from
  ``controllers/testbed_controller.py`` (its source of truth) to ``testbed/sdn/ryu_app/``, where
  :data:`testbed.sdn.client.CONTROLLER_APP` finds it;
* from the repository checkout the command runs in (the current folder or the nearest folder above
  it that holds ``experiments/`` and ``models/``; :data:`testbed.core.util.REPO_ROOT`): experiments,
  topologies, the model zoo and its profiles (``models/``), ASET checkpoints and ``runs/``. A path
  relative to the checkout, used outside one, is refused naming the checkout it needs.

``.ci/wheel-check`` builds the wheel, installs it in a scratch venv and runs it from outside the
checkout.
"""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: The Ryu app's source, and where a built package carries it (not an importable module of the package).
RYU_APP = HERE / "controllers" / "testbed_controller.py"
RYU_APP_IN_PACKAGE = Path("testbed") / "sdn" / "ryu_app" / "testbed_controller.py"


class BuildWithRyuApp(build_py):
    """``build_py`` that also copies the Ryu app into the built package (an editable install reads
    the checkout's ``controllers/`` instead)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dst = Path(self.build_lib) / RYU_APP_IN_PACKAGE
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(RYU_APP, dst)


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
    cmdclass={"build_py": BuildWithRyuApp},
)
