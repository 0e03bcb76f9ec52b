"""The setuptools shim of ``pyproject.toml`` (which holds the package's metadata, dependencies and
``testbed`` command): it adds one build step, copying the Ryu app into a built package.

What an installed copy (``pip install .``, a wheel) reads at run time:

* inside the package: its code, and the Ryu app, copied at build time from
  ``controllers/testbed_controller.py`` (its source of truth) to ``testbed/sdn/ryu_app/``, where
  :data:`testbed.sdn.client.CONTROLLER_APP` finds it;
* from the repository checkout the command runs in (the current folder or the nearest folder above
  it that holds ``experiments/`` and ``models/``; :data:`testbed.core.util.REPO_ROOT`): experiments,
  topologies, the model zoo and its profiles (``models/``), ASET checkpoints and ``runs/``. A path
  relative to the checkout, used outside one, is refused naming the checkout it needs.

An editable install (``pip install -e .``, PEP 660) reads the checkout's ``controllers/`` instead.
``.ci/wheel-check`` builds the wheel, installs it in a scratch venv and runs it from outside the
checkout, and checks that pip prints no deprecation for this package's installs.
"""

import shutil
from pathlib import Path

from setuptools import setup
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


setup(cmdclass={"build_py": BuildWithRyuApp})
