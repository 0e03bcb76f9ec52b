"""The run directory's storage: what a run writes, checked before bring-up, and a reserve held.

:func:`estimate_storage` states what a run of a plan writes, by part (:class:`StorageEstimate`,
bytes). :class:`Storage` checks the run directory before anything is built (writable, enough free
space for that estimate) and holds a reserve file (``.reserve``) during the run; the health watch
(:class:`testbed.emu.health.HealthWatch`) asks it for a problem every tick and, when the file system
fills up, frees the reserve at once, so the sources' buffered records, the merge and the summary
still fit, and stops the run. It also notices a source's records file (``sources/*.records.csv``)
that was there and is no longer (:meth:`Storage.vanished`: deleted during the run), which the
watch reports as a storage fault (exit code 4); the source writes it back from its open file when
it stops (:mod:`testbed.emu.source`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed.core.errors import EXIT_BRINGUP, RunFailure

MIB = 1024 * 1024


@dataclass
class StorageEstimate:
    """Bytes a run writes, by part (docs/trustworthy-runs.md, "Storage")."""

    records: int
    link_stats: int
    logs: int
    capture: int
    reserve: int

    @property
    def total(self) -> int:
        return self.records + self.link_stats + self.logs + self.capture + self.reserve

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in asdict(self).items() if v)
        return f"about {self.total / MIB:.1f} MiB ({parts})"


#: Bytes per query on disk: the source's CSV row (~190 B), the merged CSV row (~190 B) and its
#: Parquet row (~45 B), measured on a 200,000-query simulated run; x 1.5 for longer names and values.
BYTES_PER_QUERY = 640
#: Bytes per row of link_stats.csv (~130 B measured) x 1.5.
BYTES_PER_LINK_ROW = 200
#: Packets per query on one capture point (request, response, handshake and ACKs of a JPEG query) x 2.
PACKETS_PER_QUERY = 40
#: Logs, configs, plan.json, per component (measured: < 20 KB each on a 40 s run) x 3.
BYTES_PER_COMPONENT = 64 * 1024


def estimate_storage(plan, duration_s: float, expected_queries: int) -> StorageEstimate:
    """What a run of ``plan`` for ``duration_s`` s writes, from the expected number of queries
    (:func:`testbed.plan.build.check_load_bounds`); the reserve is what the end of the run writes
    (merged records, summary), held free during the run."""
    exp = plan.experiment
    records = expected_queries * BYTES_PER_QUERY
    rows = (len(plan.links) + len(plan.hosts)) * (duration_s / exp.emulation.stats_interval_s + 2)
    components = len(plan.hosts) + len(plan.links) + 4
    capture = 0
    if exp.capture is not None:
        spec = exp.capture
        points = len(spec.interfaces) if isinstance(spec.interfaces, list) else \
            len(plan.hosts) + (2 * len(plan.links) if spec.interfaces == "all" else 0)
        per_point = min(spec.max_mib * MIB, expected_queries * PACKETS_PER_QUERY * (spec.snaplen_bytes + 16))
        capture = int(points * per_point)
    reserve = max(8 * MIB, expected_queries * (BYTES_PER_QUERY // 2) + 2 * MIB)
    return StorageEstimate(int(records), int(rows * BYTES_PER_LINK_ROW), components * BYTES_PER_COMPONENT,
                           capture, int(reserve))


class Storage:
    """The run directory's file system: checked before bring-up, watched during the run, with a
    reserve file (``.reserve``) freed when it fills up (module docstring)."""

    def __init__(self, run_dir: Path, estimate: StorageEstimate):
        self.run_dir, self.estimate = Path(run_dir), estimate
        self.reserve_path = self.run_dir / ".reserve"
        self.released = False
        self.low_water = max(2 * MIB, estimate.reserve // 8)
        self._records: set[str] = set()  # the sources' records files seen so far (names)
        self._gone: set[str] = set()  # those reported gone

    def free_bytes(self) -> int:
        st = os.statvfs(self.run_dir)
        return st.f_bavail * st.f_frsize

    def check(self) -> None:
        """Writable, enough free space for the estimate; then take the reserve.

        Raises:
            RunFailure: (exit code 3) not writable, or too little space (states the estimate).
        """
        probe = self.run_dir / ".write-probe"
        try:
            with open(probe, "wb") as f:
                f.write(b"x" * 4096)
                f.flush()
                os.fsync(f.fileno())
            probe.unlink()
        except OSError as exc:
            probe.unlink(missing_ok=True)
            raise RunFailure(f"run directory {self.run_dir} is not writable: {exc.strerror}; choose another "
                             f"--runs-dir (or runs_dir in the experiment)", EXIT_BRINGUP) from None
        free = self.free_bytes()
        if free < self.estimate.total:
            raise RunFailure(f"run directory {self.run_dir}: {free / MIB:.1f} MiB free, and this run writes "
                             f"{self.estimate.describe()}; free some space or choose another --runs-dir",
                             EXIT_BRINGUP)
        try:
            with open(self.reserve_path, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, self.estimate.reserve)
        except OSError as exc:
            self.reserve_path.unlink(missing_ok=True)
            raise RunFailure(f"run directory {self.run_dir}: cannot reserve {self.estimate.reserve / MIB:.1f} MiB "
                             f"for the end of the run: {exc.strerror}", EXIT_BRINGUP) from None

    def release(self) -> None:
        """Free the reserve (the file system filled up, or the run is ending)."""
        self.released = True
        self.reserve_path.unlink(missing_ok=True)

    def vanished(self) -> list[str]:
        """The sources' records files (``sources/<name>.records.csv``, names relative to the run
        directory) seen by an earlier call that are not there now, each reported once: a file
        deleted (or moved away) during the run."""
        try:
            now = {f"sources/{p.name}" for p in (self.run_dir / "sources").glob("*.records.csv")}
        except OSError:
            now = set()
        gone = sorted(self._records - now - self._gone)
        self._gone |= set(gone)
        self._records |= now
        return gone

    def problem(self) -> str | None:
        """What is wrong with the run directory now (free space below the low-water mark), or None."""
        try:
            free = self.free_bytes()
        except OSError as exc:
            return f"the run directory {self.run_dir} cannot be read: {exc.strerror}"
        if free < self.low_water:
            return (f"the file system of the run directory {self.run_dir} is full ({free / MIB:.2f} MiB free, "
                    f"below {self.low_water / MIB:.0f} MiB)")
        return None


__all__ = ["MIB", "Storage", "StorageEstimate", "estimate_storage"]
