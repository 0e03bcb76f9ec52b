#!/usr/bin/env bash
# One idempotent install step for a fresh Debian 12 machine (used by README, .ci/run, Vagrantfile):
#   1. Debian packages: Mininet, Open vSwitch, iproute2, ethtool, ping, tcpdump, libpcap, build tools
#   2. starts Open vSwitch (userspace datapath works without the kernel module)
#   3. a Python 3.11 venv in .venv with the pinned versions of requirements.lock (Ryu 4.34 included;
#      it must be built with setuptools < 68, hence --no-build-isolation), and this package (editable)
#   4. Debian's Mininet library made visible inside the venv
#   5. the model zoo (models/build_zoo.py: MediaPipe .tflite files from the hash-pinned wheel, Keras
#      architectures exported to SavedModel and LiteRT, the small digits models for quick checks);
#      TESTBED_ZOO_FAMILIES=digits (or digits,parity,cancer) builds only those small trained families
#      (build_zoo.py --families: no download, minutes instead of an hour on a slow machine or guest)
#   --with-tests: also what only the test suite needs (Debian's chromium: the HTML report is opened in a
#      headless browser by tests/test_report_browser.py)
# Re-running it does only what is missing. Needs root.
set -euo pipefail
cd "$(dirname "$0")"
if [ "$(id -u)" != 0 ]; then echo "install.sh needs root: sudo ./install.sh" >&2; exit 1; fi

APT_PKGS="mininet openvswitch-switch iproute2 ethtool iputils-ping tcpdump libpcap0.8 psmisc procps iperf3
          net-tools python3 python3-venv python3-dev gcc"
for arg in "$@"; do
  case "$arg" in
    --with-tests) APT_PKGS="$APT_PKGS chromium" ;;
    *) echo "install.sh: unknown option '$arg' (the one option: --with-tests)" >&2; exit 2 ;;
  esac
done
missing=""
for p in $APT_PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "== apt: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing
fi

if ! ovs-vsctl --timeout=3 show >/dev/null 2>&1; then
  echo "== starting Open vSwitch"
  /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random 2>&1 | grep -v ulimit || true
  ovs-vsctl --timeout=10 show >/dev/null
fi

PY=""
for cand in python3.11 python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    PY=$(command -v "$cand"); break
  fi
done
[ -n "$PY" ] || { echo "Python 3.11 is required (Debian 12's python3 is 3.11)" >&2; exit 1; }

stamp=".venv/.installed-$(cat requirements.lock pyproject.toml setup.py | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "== Python venv (.venv) from requirements.lock"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  # pip's own output goes to .venv/install.log too: .ci/wheel-check finds any deprecation there.
  # Ryu is built through PEP 517 (--use-pep517) with the venv's setuptools < 68 (--no-build-isolation);
  # this package is installed editable through PEP 660 (pyproject.toml).
  {
    .venv/bin/pip install -q --no-cache-dir --upgrade 'pip==25.2'
    .venv/bin/pip install -q --no-cache-dir 'setuptools==65.5.0' 'wheel==0.48.0' 'pbr==7.1.3'
    .venv/bin/pip install -q --no-cache-dir --no-build-isolation --use-pep517 -r requirements.lock
    .venv/bin/pip install -q --no-cache-dir --no-build-isolation --no-deps -e .
  } 2>&1 | tee .venv/install.log | { grep -v "^WARNING: Location 'file:" || true; }
  rm -f .venv/.installed-*
  touch "$stamp"
fi

site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -e "$site/mininet" ] || ln -sfn /usr/lib/python3/dist-packages/mininet "$site/mininet"
.venv/bin/python -c 'import mininet.net, ryu, tensorflow' 2>/dev/null || {
  echo "venv check failed: cannot import mininet, ryu or tensorflow" >&2; exit 1; }

if [ -n "${TESTBED_ZOO_FAMILIES:-}" ]; then
  .venv/bin/python models/build_zoo.py --families "$TESTBED_ZOO_FAMILIES"
else
  .venv/bin/python models/build_zoo.py
fi
echo "== install.sh: done"
