#!/usr/bin/env bash
# The users' kernel path (OVS kernel datapath + netem), run in a Debian 12 guest under QEMU.
#
#   sudo benchmarks/kernel_path_guest.sh            # all steps; a re-run skips the finished ones
#   KP_FRESH=1 sudo benchmarks/kernel_path_guest.sh # forget the guest's disk (keeps the base image)
#
# Steps, each with a stamp in $KP_CACHE/work/stamps (a re-run, or a restart after a kill, goes on
# from the first unfinished one; its wall time goes to $KP_CACHE/work/steps.tsv):
#   image     mmdebstrap a Debian 12 root filesystem from Debian packages alone (the kernel,
#             openssh-server, and the Debian packages install.sh asks for), the host's CA
#             certificates in it (pip behind a TLS-inspecting proxy), a generated root ssh key;
#             mke2fs -d makes the ext4 disk (no loop device). Cached in $KP_CACHE/base, keyed by
#             the package list: reused by every later run on this machine.
#   overlay   a qcow2 overlay on the base image: the guest's own disk (install and runs go there).
#   boot      QEMU, software emulation (-accel tcg -cpu $KP_CPU), user-mode networking only: ssh
#             forwarded on 127.0.0.1:$KP_SSH_PORT, no host bridge, no address on the host.
#             KP_CPU (default SandyBridge-v2): a named model with AVX but without AVX2 and AVX-512.
#             TensorFlow's wheel needs AVX (install.sh imports it); with `-cpu max` (AVX2) the
#             guest's run died with SIGSEGV in pandas' groupby (numpy's AVX2 sort paths under TCG's
#             vector emulation, new in QEMU 7.2, are the suspect); without AVX2 numpy takes its
#             SSE/AVX paths.
#             Not stamped: done on every invocation that has steps left.
#   copy      `git archive HEAD` of the checkout this script is in, to /root/testbed in the guest.
#   zoo       the reduced zoo (KP_ZOO_FAMILIES, models/build_zoo.py --families) built on the host
#             (seconds; under TCG its training took over 85 min) and copied into the guest's
#             models/zoo: the files are the same on both (pinned TensorFlow), and every load checks
#             their SHA-256 against the manifest.
#   install   ./install.sh in the guest with TESTBED_ZOO_FAMILIES=digits (finds that zoo up to date).
#   run       testbed run experiments/kernel-path.yaml (kernel datapath + netem forced, three link
#             events) in the guest.
#   fetch     the run folder back to $KP_OUT/<run id> on the host.
#   check     the run's run.json says datapath kernel and link emulator netem; prints the RTT
#             self-check (rtt_check.csv) and the events' read-back (events.csv).
#   validate  `python -m benchmarks.dilation validate $KP_VALIDATE --k auto --duration
#             $KP_VALIDATE_DURATION` in the guest (the experiment at auto, against the simulator;
#             default KP_VALIDATE: the kernel-path experiment, which the digits zoo serves), and its
#             validate.{json,md} back to $KP_OUT/validate.
#   shutdown  poweroff in the guest; QEMU exits.
# The stamps of copy / install / run / fetch / check name the commit: a new commit copies again
# (install.sh then does only what changed). On exit the script stops the QEMU it started, and only
# that one. Not part of CI: it takes an hour or more (docs/history.md ("The kernel path in a QEMU guest") has the figures).
#
# Settings (environment): KP_CACHE (default /var/cache/testbed-guest), KP_SSH_PORT (10022),
# KP_SMP (2), KP_MEM_MB (4096), KP_DISK_GB (16), KP_OUT (<repo>/runs/kernel-path-guest),
# KP_EXPERIMENT (experiments/kernel-path.yaml), KP_ZOO_FAMILIES (digits),
# KP_CPU (SandyBridge-v2), KP_VALIDATE (experiments/kernel-path.yaml), KP_VALIDATE_DURATION (20s),
# KP_STEPS (the steps to do, default all, in the order above), KP_RUN_ARGS (more options of
# `testbed run`, e.g. `--time-dilation 4`), KP_CGROUP (v2, Debian 12's default, or v1: the guest
# kernel boots with systemd.unified_cgroup_hierarchy=0; time dilation above 1 needs v1).
set -euo pipefail

REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
CACHE=${KP_CACHE:-/var/cache/testbed-guest}
PORT=${KP_SSH_PORT:-10022}
SMP=${KP_SMP:-2}
MEM_MB=${KP_MEM_MB:-4096}
DISK_GB=${KP_DISK_GB:-16}
OUT=${KP_OUT:-$REPO/runs/kernel-path-guest}
EXPERIMENT=${KP_EXPERIMENT:-experiments/kernel-path.yaml}
RUN_ARGS=${KP_RUN_ARGS:-}
CGROUP=${KP_CGROUP:-v2}
ZOO_FAMILIES=${KP_ZOO_FAMILIES:-digits}
CPU=${KP_CPU:-SandyBridge-v2}
VALIDATE=${KP_VALIDATE:-experiments/kernel-path.yaml}
VALIDATE_DURATION=${KP_VALIDATE_DURATION:-20s}
STEPS=${KP_STEPS:-image overlay boot copy zoo install run fetch check validate shutdown}
SUITE=bookworm
BASE=$CACHE/base
WORK=$CACHE/work
STAMPS=$WORK/stamps
COMMIT=$(git -C "$REPO" rev-parse HEAD)
SHORT=${COMMIT:0:12}
QEMU_PID=""

log() { printf '[kernel-path %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, mke2fs -d of a root filesystem): sudo $0"
for tool in mmdebstrap mke2fs qemu-system-x86_64 qemu-img ssh ssh-keygen git python3; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install mmdebstrap qemu-system-x86 qemu-utils openssh-client)"
done
if [ -n "${KP_FRESH:-}" ]; then log "KP_FRESH: removing $WORK"; rm -rf "$WORK"; fi
mkdir -p "$BASE" "$WORK" "$STAMPS"

SSH_OPTS=(-i "$BASE/id_ed25519" -p "$PORT" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
          -o LogLevel=ERROR -o BatchMode=yes -o ConnectTimeout=20 -o ServerAliveInterval=30
          -o ServerAliveCountMax=20)
# shellcheck disable=SC2029  # the commands are meant to expand on this side (paths, commit)
gssh() { ssh "${SSH_OPTS[@]}" root@127.0.0.1 "$@"; }

# The Debian packages: the guest's kernel and ssh, and install.sh's own list (read from it, so
# that the two stay the same; install.sh then finds them installed).
apt_packages() {
  local pkgs
  pkgs=$(sed -n '/^APT_PKGS="/,/"$/p' "$REPO/install.sh" | tr -d '"' | sed 's/^APT_PKGS=//' | tr -s ' \n' ' ')
  [ -n "$pkgs" ] || die "cannot read APT_PKGS from install.sh"
  echo "linux-image-amd64 openssh-server systemd-sysv udev kmod ca-certificates git $pkgs" | tr ' ' '\n' \
    | grep -v '^$' | sort -u | tr '\n' ','| sed 's/,$//'
}

stamp_of() {  # the stamp file of step $1 (image: keyed by the package list; commit-bound steps: by commit)
  case $1 in
    image) echo "$BASE/.image-$(apt_packages | sha256sum | cut -c1-12)" ;;
    overlay) echo "$STAMPS/overlay" ;;
    *) echo "$STAMPS/$1-$SHORT" ;;
  esac
}

# Run step $1 (function step_$1) unless stamped; record its wall time in steps.tsv.
do_step() {
  local name=$1 stamp t0 t1 rc=0
  stamp=$(stamp_of "$name")
  if [ "$name" != boot ] && [ "$name" != shutdown ] && [ -f "$stamp" ]; then
    log "step $name: done before ($(cat "$stamp")), skipped"
    return 0
  fi
  log "step $name: start"
  t0=$(date +%s)
  [ "$name" != boot ] || start_qemu  # in this shell: the exit trap must know the pid
  # A subshell with errexit on: a step stops at its first failing command (a function called
  # from `f || ...` would run with errexit off).
  set +e
  (set -e; "step_$name")
  rc=$?
  set -e
  t1=$(date +%s)
  printf '%s\t%s\t%s\t%d\t%s\n' "$name" "$SHORT" "$(date -u -d "@$t0" +%FT%TZ)" "$((t1 - t0))" \
    "$([ $rc = 0 ] && echo ok || echo "failed ($rc)")" >> "$WORK/steps.tsv"
  [ $rc = 0 ] || die "step $name failed (exit $rc) after $((t1 - t0)) s"
  [ "$name" = boot ] || [ "$name" = shutdown ] || echo "$(date -u +%FT%TZ) $((t1 - t0)) s" > "$stamp"
  log "step $name: done in $((t1 - t0)) s"
}

# ------------------------------------------------------------------------------------------ steps

step_image() {
  local root=$BASE/rootfs pkgs
  pkgs=$(apt_packages)
  rm -rf "$root" "$BASE/disk.img" "$BASE"/vmlinuz "$BASE"/initrd.img "$BASE"/.image-*
  [ -f "$BASE/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C kernel-path-guest -f "$BASE/id_ed25519"
  log "mmdebstrap $SUITE with: $pkgs"
  mmdebstrap --variant=important --include="$pkgs" "$SUITE" "$root" http://deb.debian.org/debian
  # The guest's settings, written into the root filesystem (a directory: no chroot needed but for
  # the two commands that read the guest's own files).
  echo kernel-path-guest > "$root/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 kernel-path-guest\n' > "$root/etc/hosts"
  echo '/dev/vda / ext4 defaults,noatime 0 1' > "$root/etc/fstab"
  printf '[Match]\nName=e*\n[Network]\nDHCP=yes\n' > "$root/etc/systemd/network/10-guest.network"
  chroot "$root" systemctl enable systemd-networkd
  rm -f "$root/etc/resolv.conf"
  echo 'nameserver 10.0.2.3' > "$root/etc/resolv.conf"  # QEMU user-mode networking's DNS
  install -d -m 700 "$root/root/.ssh"
  install -m 600 "$BASE/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
  # pip verifies TLS against the system store: the host's own CAs (e.g. a TLS-inspecting proxy's).
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  chroot "$root" update-ca-certificates
  cp "$(find "$root/boot" -name 'vmlinuz-*' | sort | tail -1)" "$BASE/vmlinuz"
  cp "$(find "$root/boot" -name 'initrd.img-*' | sort | tail -1)" "$BASE/initrd.img"
  truncate -s "${DISK_GB}G" "$BASE/disk.img"
  mke2fs -q -F -t ext4 -L guestroot -d "$root" "$BASE/disk.img"
  rm -rf "$root"
  rm -f "$STAMPS/overlay"  # an overlay of an older base is no longer valid
}

step_overlay() {
  rm -f "$WORK/guest.qcow2" "$STAMPS"/*
  qemu-img create -q -f qcow2 -b "$BASE/disk.img" -F raw "$WORK/guest.qcow2"
}

stop_stale_qemu() {  # a QEMU of an earlier, killed invocation of this script (same disk): ours
  local pid
  [ -f "$WORK/qemu.pid" ] || return 0
  pid=$(cat "$WORK/qemu.pid")
  if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "$WORK/guest.qcow2"; then
    log "stopping QEMU $pid left by an earlier run of this script"
    kill "$pid"; sleep 3; kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$WORK/qemu.pid"
}

start_qemu() {
  local CGROUP_ARG=""
  case $CGROUP in
    v2) ;;
    v1) CGROUP_ARG=" systemd.unified_cgroup_hierarchy=0" ;;
    *) die "KP_CGROUP=$CGROUP: give v1 or v2" ;;
  esac
  stop_stale_qemu
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    die "127.0.0.1:$PORT is in use by another process: set KP_SSH_PORT"
  fi
  qemu-system-x86_64 -accel tcg,thread=multi -cpu "$CPU" -smp "$SMP" -m "$MEM_MB" \
    -display none -monitor none -serial "file:$WORK/console.log" \
    -kernel "$BASE/vmlinuz" -initrd "$BASE/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 net.ifnames=0 systemd.show_status=0$CGROUP_ARG" \
    -drive "file=$WORK/guest.qcow2,if=virtio,format=qcow2,cache=writeback" \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$PORT-:22" -device virtio-net-pci,netdev=n0 \
    -pidfile "$WORK/qemu.pid" &
  QEMU_PID=$!
  log "QEMU $QEMU_PID: TCG, CPU model $CPU, $SMP vCPU, $MEM_MB MB, ssh on 127.0.0.1:$PORT"
}

step_boot() {  # wait for ssh (start_qemu has launched the guest)
  local deadline=$(( $(date +%s) + 1200 ))
  until gssh true 2>/dev/null; do
    kill -0 "$QEMU_PID" 2>/dev/null || die "QEMU exited during boot (console: $WORK/console.log)"
    [ "$(date +%s)" -lt "$deadline" ] || die "no ssh after 1200 s (console: $WORK/console.log)"
    sleep 5
  done
  gssh 'uname -r; nproc; free -m | sed -n 2p; grep -o -w "avx512f\|avx2\|avx\|sse4_2" /proc/cpuinfo | sort -u | tr "\n" " "; echo'
}

step_copy() {
  # shellcheck disable=SC2016  # $(...) runs in the guest
  git -C "$REPO" archive --format=tar "$COMMIT" \
    | gssh 'mkdir -p /root/testbed && tar -x -m -C /root/testbed && echo "copied $(find /root/testbed -type f -not -path "*/.venv/*" | wc -l) files"'
  gssh "echo $COMMIT > /root/testbed/.commit"
}

step_zoo() {
  local zoo=$WORK/zoo-${ZOO_FAMILIES//,/-}
  [ -x "$REPO/.venv/bin/python" ] || die "no $REPO/.venv on the host: run ./install.sh there first (the zoo step builds with it)"
  "$REPO/.venv/bin/python" "$REPO/models/build_zoo.py" --families "$ZOO_FAMILIES" --out "$zoo" \
    --profiles "$REPO/models/profiles" --no-profile  # the profiles are the committed ones
  gssh 'rm -rf /root/testbed/models/zoo && mkdir -p /root/testbed/models/zoo'
  tar -C "$zoo" -c . | gssh 'tar -x -C /root/testbed/models/zoo && ls /root/testbed/models/zoo | wc -l'
}

step_install() {
  gssh "cd /root/testbed && TESTBED_ZOO_FAMILIES='$ZOO_FAMILIES' PIP_PROGRESS_BAR=off ./install.sh" 2>&1 \
    | tee -a "$WORK/install.log"
  return "${PIPESTATUS[0]}"
}

guest_detached() {  # guest_detached NAME WHAT LIMIT_S POLL_S PREP CMD
  # CMD in the guest's /root/testbed after PREP, detached (setsid, its output to /root/runs/NAME.log,
  # its exit code to NAME.rc, PYTHONFAULTHANDLER=1): an ssh session that drops under TCG (one did, at
  # the summary of a dilated run) cannot take it down. Waits for NAME.rc, polling every POLL_S, at
  # most LIMIT_S.
  local name=$1 what=$2 limit=$3 poll=$4 prep=$5 cmd=$6 deadline
  gssh "cd /root/testbed && $prep && rm -f /root/runs/$name.rc /root/runs/$name.log \
        && (setsid sh -c 'PYTHONFAULTHANDLER=1 $cmd > /root/runs/$name.log 2>&1; \
              echo \$? > /root/runs/$name.rc' < /dev/null > /dev/null 2>&1 &)"
  deadline=$(( $(date +%s) + limit ))
  until gssh "test -s /root/runs/$name.rc" 2>/dev/null; do
    [ "$(date +%s)" -lt "$deadline" ] || die "the guest's $what did not end within $limit s (its log: /root/runs/$name.log)"
    sleep "$poll"
  done
}

step_run() {  # a failed run is kept too (its folder says why): the check step judges it
  local rc
  guest_detached kp run 7200 15 "modprobe openvswitch && modprobe sch_netem && mkdir -p /root/runs" \
    ".venv/bin/testbed run $EXPERIMENT --runs-dir /root/runs $RUN_ARGS"
  gssh 'cat /root/runs/kp.log' | tee -a "$WORK/run.log"
  rc=$(gssh 'cat /root/runs/kp.rc')
  gssh 'ls -1t /root/runs | grep -v -e "^kp\." -e "^val\." -e "^auto-dilation$" -e "^validate$" | head -1' > "$WORK/run_id"
  echo "$rc" > "$WORK/run_rc"
  log "run folder: $(cat "$WORK/run_id") (testbed run exit $rc)"
  [ -s "$WORK/run_id" ] || die "no run folder in the guest's /root/runs"
}

step_fetch() {
  local id
  id=$(cat "$WORK/run_id")
  [ -n "$id" ] || die "no run id recorded (step run)"
  mkdir -p "$OUT"
  rm -rf "${OUT:?}/$id"
  gssh "tar -C /root/runs -c '$id'" | tar -x -C "$OUT"
  cp "$WORK/steps.tsv" "$OUT/$id/guest_steps.tsv"
  gssh 'uname -r; ovs-vsctl --version | head -1; lsmod | grep -E "^(openvswitch|sch_netem) "' \
    > "$OUT/$id/guest_kernel.txt"
  log "run folder copied to $OUT/$id"
}

step_check() {
  local dir
  dir=$OUT/$(cat "$WORK/run_id")
  python3 - "$dir" "$(cat "$WORK/run_rc")" <<'EOF'
import csv, json, sys
from pathlib import Path
d = Path(sys.argv[1])
run = json.loads((d / "run.json").read_text())
print(f"run {run['run_id']}: testbed run exit {sys.argv[2]}, status {run['status']}, datapath "
      f"{run.get('datapath')}, link emulator {run.get('link_emulator')}, message {run.get('message')}")
rows = list(csv.DictReader(open(d / "rtt_check.csv")))
print("RTT self-check (source, cluster, expected ms, median ms, tolerance ms, ok):")
for r in rows:
    print(f"  {r['source']:>6} {r['cluster']:>6} {float(r['expected_rtt_ms']):8.3f} {float(r['median_rtt_ms']):8.3f}"
          f" {float(r['tolerance_ms']):7.3f} {r['ok']}")
ev = d / "events.csv"
if ev.is_file():
    print("events (kind, target, planned s, lag ms, asked, measured, unit, tolerance, ok):")
    for r in csv.DictReader(open(ev)):
        print(f"  {r['kind']:>10} {r['target']:>8} {r['planned_s']:>6} {r['lag_ms']:>8} {r['value_asked']:>8}"
              f" {r['value_measured']:>9} {r['unit']:>5} {r['tolerance']:>7} {r['ok']} {r['note']}")
bad = []
if run.get("datapath") != "kernel":
    bad.append(f"datapath {run.get('datapath')!r}, not kernel")
if run.get("link_emulator") != "netem":
    bad.append(f"link emulator {run.get('link_emulator')!r}, not netem")
if run.get("status") != "ok":
    bad.append(f"run status {run.get('status')!r}")
if (run.get("summary") or {}).get("status") != "ok" or not (d / "summary.json").is_file():
    bad.append(f"summary {(run.get('summary') or {}).get('status')!r} (run.json: summary), not ok")
print(f"verdict (before the summary): {run.get('verdict')}")
if bad:
    sys.exit("check failed: " + "; ".join(bad) + " (to run again: rm the run-*, fetch-* and check-* stamps)")
print("check: kernel datapath and netem, run ok")
EOF
}

step_validate() {  # detached as the run step is
  guest_detached val validate 10800 30 "mkdir -p /root/runs/validate" \
    ".venv/bin/python -m benchmarks.dilation --out /root/runs/validate validate $VALIDATE --k auto --duration $VALIDATE_DURATION"
  gssh 'cat /root/runs/val.log' | tee -a "$WORK/validate.log"
  mkdir -p "$OUT/validate"
  gssh 'tar -C /root/runs/validate -c validate.json validate.md validate.csv' | tar -x -C "$OUT/validate"
  log "validate exit $(gssh 'cat /root/runs/val.rc'); $OUT/validate/validate.md"
  [ "$(gssh 'cat /root/runs/val.rc')" = 0 ]
}

step_shutdown() {  # in do_step's subshell: cleanup sees the QEMU gone
  [ -n "$QEMU_PID" ] || return 0
  gssh 'systemctl poweroff' 2>/dev/null || true
  local i
  for i in $(seq 1 120); do
    kill -0 "$QEMU_PID" 2>/dev/null || { rm -f "$WORK/qemu.pid"; return 0; }
    [ "$i" -lt 120 ] && sleep 2
  done
  die "QEMU $QEMU_PID still running 240 s after poweroff"
}

cleanup() {  # only the QEMU this invocation started
  if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
    log "exit: powering the guest off (QEMU $QEMU_PID)"
    timeout 60 ssh "${SSH_OPTS[@]}" root@127.0.0.1 'sync; systemctl poweroff' 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 2; done
    kill "$QEMU_PID" 2>/dev/null || true
    rm -f "$WORK/qemu.pid"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "repo $REPO at $SHORT; cache $CACHE; steps: $STEPS"
for s in $STEPS; do
  case $s in
    image|overlay|boot|copy|zoo|install|run|fetch|check|validate|shutdown) ;;
    *) die "unknown step $s" ;;
  esac
done
pending=""
for s in $STEPS; do
  case $s in
    boot|shutdown) ;;
    *) [ -f "$(stamp_of "$s")" ] || pending="$pending $s" ;;
  esac
done
for s in $STEPS; do
  # The guest is booted only when a later step needs it.
  if { [ "$s" = boot ] || [ "$s" = shutdown ]; } && ! grep -qE 'copy|zoo|install|run|fetch|validate' <<< "$pending"; then
    continue
  fi
  do_step "$s"
done
log "all steps done; steps and wall times: $WORK/steps.tsv"
