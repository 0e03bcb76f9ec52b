"""The chores every part of the testbed needs, written once.

* :data:`REPO_ROOT` and :func:`repo_path`: where the repository checkout is (the experiments,
  topologies, model zoo and runs), and a configured folder resolved against it.
* :func:`write_json_atomic`: a JSON file (or a pydantic model) written atomically.
* :func:`poll_until`: wait for a condition with a timeout, watching a process.
* :func:`stop_processes`: signal, wait, then kill.
* :func:`ci95`: mean and 95 % confidence half-width (Student's t, ``scipy.stats.t``).
* :func:`markdown_table`: a real Markdown table (``pandas.DataFrame.to_markdown``, tabulate).
* :func:`scenarios_problem`: the same scenario file twice, or two of one experiment name.
* :func:`read_input_text`: a user's input file (experiment, topology, trace, demand matrix) as
  text, refused clearly when it is not a regular file, too large or not UTF-8.
* :func:`provenance`: the command line and the code (git commit) a run came from, for its run.json.
* :func:`did_you_mean`: `` (did you mean 'x'?)`` for a name that is not one of the known ones.
* :func:`native_stderr_to`: what native libraries write to file descriptor 2 (TensorFlow's and
  LiteRT's C++ log lines) goes to a log file instead of the console, for the time of a block.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from testbed.core.errors import InputError, RunFailure


def _is_checkout(folder: Path) -> bool:
    """Whether ``folder`` is a checkout of this repository (it holds ``experiments/`` and ``models/``)."""
    return (folder / "experiments").is_dir() and (folder / "models").is_dir()


def _find_checkout() -> tuple[Path | None, Path]:
    """(the checkout this package's code lives in, or None for an installed copy; the checkout the
    command works in). A source tree or an editable install reads its own checkout; an installed
    copy (a wheel in site-packages) reads the current folder's checkout, or that of the nearest
    folder above it, as a researcher runs ``testbed`` from a checkout; without one, the current
    folder (and :func:`repo_path` then refuses a path relative to the checkout)."""
    here = Path(__file__).resolve().parents[2]
    if _is_checkout(here) and (here / "testbed").is_dir():
        return here, here
    try:
        cwd = Path.cwd()
    except OSError:  # the current folder was removed
        return None, Path("/")
    return None, next((d for d in (cwd, *cwd.parents) if _is_checkout(d)), cwd)


#: ``SOURCE_CHECKOUT``: the checkout that holds this package's code (a source tree or an editable
#: install), None when the package is an installed copy (a wheel in site-packages).
#: ``REPO_ROOT``: the checkout the testbed works in (experiments, topologies, ``models/``: the zoo and
#: its profiles, ``controllers/``, ``runs/``): the package's own; for an installed copy, the current
#: folder's checkout or the nearest one above it (``testbed`` is run from a checkout), else the
#: current folder.
SOURCE_CHECKOUT, REPO_ROOT = _find_checkout()

T = TypeVar("T")

#: The largest input file read (experiment, topology, trace, demand matrix), bytes: far above any
#: real one (a 10^6-arrival trace is ~10 MB), below what would exhaust the memory.
MAX_INPUT_BYTES = 256 * 1024 * 1024


class InputFileError(InputError):
    """An input file that cannot be read as text; ``str(exc)`` names the file and why."""


def provenance(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Where a run came from, for its ``run.json``: ``command`` (the process's command line,
    shell-quoted, the program by its name), ``git_commit`` and ``git_dirty`` (the repository's
    HEAD and whether tracked files differ from it; None when git cannot tell). A figure is then
    reproduced by running that command on that commit."""
    import shlex

    args = list(sys.argv if argv is None else argv)
    if args:
        args[0] = Path(args[0]).name  # testbed, or a benchmark's script: not this machine's path
    commit, dirty = _git_state()
    return {"command": shlex.join(args), "git_commit": commit, "git_dirty": dirty}


@functools.lru_cache(maxsize=1)
def _git_state() -> tuple[str | None, bool | None]:
    """(HEAD, whether tracked files differ from it) of the repository, once per process (a sweep
    writes a run per cell); (None, None) when git cannot tell."""
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if head.returncode != 0 or dirty.returncode != 0:
        return None, None
    return head.stdout.strip(), bool(dirty.stdout.strip())


def read_input_text(path: str | os.PathLike[str], max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The whole of a user's input file as UTF-8 text.

    A directory, a device (``/dev/zero``), a FIFO or a socket is refused before it is opened:
    reading one could block or never end.

    Raises:
        InputFileError: missing or unreadable (the OS's reason), not a regular file, larger than
            ``max_bytes``, or not UTF-8 (with the offset of the first bad byte).
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise InputFileError(f"{p}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError(f"{p} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{p} is not a regular file (a device, a FIFO or a socket)")
    if st.st_size > max_bytes:
        raise InputFileError(f"{p}: {st.st_size} bytes, more than the {max_bytes} read")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{p}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{p}: not UTF-8 text (byte {exc.start})") from None


def repo_path(path: str | os.PathLike[str], base: Path | None = None) -> Path:
    """``path`` as given when absolute, else relative to ``base`` (default: :data:`REPO_ROOT`).

    Raises:
        InputError: ``path`` is relative, ``base`` is not given, and there is no checkout to resolve
            it against (an installed copy run outside a checkout).
    """
    p = Path(path)
    if p.is_absolute():
        return p
    if base is None:
        if SOURCE_CHECKOUT is None and not _is_checkout(REPO_ROOT):
            raise InputError(f"{p} is a folder of the repository checkout, and there is none here: testbed is "
                             f"installed ({Path(__file__).resolve().parents[1]}) and neither {REPO_ROOT} nor a "
                             f"folder above it holds experiments/ and models/; run testbed from a checkout of "
                             f"the repository, or give an absolute path")
        base = REPO_ROOT
    return base / p


def replace_atomic(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` to a temporary file in ``path``'s folder, then ``os.replace`` it over
    ``path``: ``path`` is whole, or as it was before, never truncated (a full disk, a crash).

    Raises:
        OSError: the folder is not writable or the disk is full (the temporary file is removed;
            so it is on any other exception of ``write``).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike[str], data: Any, indent: int | None = 1) -> Path:
    """Write ``data`` (a JSON-serialisable object, or a pydantic model: ``model_dump_json``) to
    ``path`` atomically (:func:`replace_atomic`).

    Raises:
        OSError: the folder is not writable or the disk is full (the temporary file is removed).
    """
    text = data.model_dump_json(indent=indent) if hasattr(data, "model_dump_json") else json.dumps(data, indent=indent)
    return replace_atomic(path, lambda tmp: tmp.write_text(text))


def poll_until(check: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.1,
               proc: subprocess.Popen | None = None, exit_code: int | None = None) -> T:
    """Call ``check()`` every ``interval_s`` s until it returns something other than None/False;
    return that.

    Args:
        check: the condition (may return a value, e.g. a status dict).
        timeout_s: give up after this many seconds.
        what: what is awaited, for the error message (e.g. ``"ryu-manager listening on :6653"``).
        proc: a process whose exit, or stop (:func:`stopped`), ends the wait at once (it was
            supposed to make ``check`` true).
        exit_code: the exit code of the :class:`RunFailure` raised (default: bring-up failure).

    Raises:
        RunFailure: ``proc`` exited or is stopped, or ``timeout_s`` passed; the message says which
            and names ``what``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got is not None and got is not False:
            return got
        if proc is not None and proc.poll() is not None:
            raise RunFailure(f"{what}: the process exited with code {proc.returncode} first", exit_code)
        if proc is not None and stopped(proc.pid):
            raise RunFailure(f"{what}: {stopped(proc.pid)}", exit_code)
        if time.monotonic() >= deadline:
            raise RunFailure(f"{what}: not within {timeout_s:g} s", exit_code)
        time.sleep(interval_s)


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (proc(5): ``[0]`` the state letter,
    ``[19]`` the start time in clock ticks since boot), or None when there is no such process.
    The name is skipped up to its last ``)``, since it may hold spaces and parentheses."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def stopped(pid: int) -> str:
    """Why process ``pid`` cannot make progress when it is stopped (state ``T`` in
    ``/proc/PID/stat``: it got SIGSTOP, SIGTSTP, SIGTTIN or SIGTTOU), naming it; ``""`` otherwise
    (running, sleeping, gone)."""
    fields = proc_stat(pid)
    if not fields or fields[0] != "T":
        return ""
    return (f"the process (pid {pid}) is stopped (process state 'T': it got SIGSTOP or SIGTSTP) and does nothing "
            f"until it is continued (kill -CONT {pid})")


def stop_processes(procs: Iterable[subprocess.Popen], sig: int = signal.SIGTERM, timeout_s: float = 5.0) -> None:
    """Send ``sig`` to every process still running, then SIGCONT (a stopped process would hold
    ``sig`` until the SIGKILL), wait up to ``timeout_s`` s in all, then SIGKILL what is left and
    reap it. Safe on processes that already exited."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(sig)
                p.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def natural_key(name: str) -> tuple:
    """Sort key that orders the numbers inside names by value: ``l2`` before ``l10`` (a plain
    string sort gives l1, l10, l11, ..., l2)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name))


def did_you_mean(name: object, options: Iterable[str], n: int = 3, cutoff: float = 0.5) -> str:
    """`` (did you mean 'x', 'y'?)`` for the ``options`` close to ``name`` (``difflib``'s ratio >=
    ``cutoff``, closest first, at most ``n``), or "" when none is close or ``name`` is not a string."""
    import difflib

    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(dict.fromkeys(options)), n=n, cutoff=cutoff)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


def repeated(items: Sequence[T]) -> list[T]:
    """The items of ``items`` that occur more than once, each once, sorted (for the errors that
    name what was given twice: a model, a seed, a policy, a column)."""
    from collections import Counter

    return sorted(x for x, k in Counter(items).items() if k > 1)


def scenarios_problem(item: str, files: Sequence[str | os.PathLike[str]], names: Sequence[str],
                      keyed_by: str) -> str | None:
    """What makes a list of scenario files unusable as one set, or None: a file listed twice (two
    spellings of one path too: its runs would count twice), or two files of one experiment
    ``name`` (whatever is keyed by the name, ``keyed_by``, would take them for one). ``item``
    names the list (``training.scenarios``). The one rule of ``testbed train``, ``testbed
    evaluate`` and ``testbed sweep``; each caller raises its own error type with the message."""
    resolved = [str(Path(f).resolve()) for f in files]
    twice = repeated(resolved)
    if twice:
        given = [str(f) for f, r in zip(files, resolved, strict=True) if r == twice[0]]
        spellings = f" (as {' and '.join(given)})" if len(set(given)) > 1 else ""
        return f"{item}: {given[0]} is listed twice{spellings}: its runs would count twice"
    same = repeated(list(names))
    if same:
        both = [str(f) for f, n in zip(files, names, strict=True) if n == same[0]]
        return (f"{item}: {' and '.join(both)} are both named {same[0]!r}: {keyed_by} key a scenario by its name, "
                f"so the two would be taken for one; give each its own name")
    return None


def ci95(values: Sequence[float | None]) -> tuple[float, float]:
    """Mean and half-width of the 95 % confidence interval of the mean, Student's t with n - 1
    degrees of freedom: mean +- t_{0.975, n-1} x s / sqrt(n) (``scipy.stats.t``). None and NaN
    values are left out; half-width NaN for fewer than 2 values, mean NaN for none."""
    from scipy import stats

    v = [float(x) for x in values if x is not None and not math.isnan(float(x))]
    if not v:
        return math.nan, math.nan
    m = sum(v) / len(v)
    if len(v) < 2:
        return m, math.nan
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))
    return m, float(stats.t.ppf(0.975, len(v) - 1)) * sd / math.sqrt(len(v))


def paired_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """``a - b`` paired per seed (the same index: common random numbers), the pairs with a None or
    NaN left out: ``mean`` and ``ci`` (the 95 % CI half-width, :func:`ci95`), ``n`` (pairs) and
    ``p`` (two-sided paired t test, ``scipy.stats.ttest_rel``; with no spread, 1.0 when every
    difference is 0 and 0.0 when they are all one other value; NaN for fewer than 2 pairs)."""
    from scipy import stats

    d = [(float(x), float(y)) for x, y in zip(a, b, strict=True)
         if x is not None and y is not None and not math.isnan(float(x)) and not math.isnan(float(y))]
    m, h = ci95([x - y for x, y in d])
    diffs = {x - y for x, y in d}
    if len(d) < 2:
        p = math.nan
    elif len(diffs) == 1:  # no spread: certain (or no difference at all)
        p = 1.0 if diffs == {0.0} else 0.0
    else:
        p = float(stats.ttest_rel([x for x, _ in d], [y for _, y in d]).pvalue)
    return {"mean": m, "ci": h, "n": len(d), "p": p}


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> list[bool]:
    """Which of ``pvalues`` are rejected at family-wise level ``alpha`` by Holm's step-down method
    (Holm, "A simple sequentially rejective multiple test procedure", Scand. J. Statist. 1979):
    sorted ascending, the i-th (from 0) is rejected while p <= alpha / (m - i). NaN is never rejected."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: (math.isnan(pvalues[i]), pvalues[i]))
    out = [False] * m
    for rank, i in enumerate(order):
        p = pvalues[i]
        if math.isnan(p) or p > alpha / (m - rank):
            break
        out[i] = True
    return out


def markdown_table(rows: Any, columns: Sequence[str] | None = None) -> str:
    """A GitHub-flavoured Markdown table of ``rows`` (a DataFrame, or a list of dicts), with
    ``columns`` in that order (default: all). Cells are text: ``|`` in a cell is escaped, None and
    NaN are left empty. Uses ``pandas.DataFrame.to_markdown`` (the tabulate package)."""
    import pandas as pd

    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if columns is not None:
        df = df.reindex(columns=list(columns))

    def cell(v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        return str(v).replace("|", "\\|").replace("\n", " ")

    text = df.astype(object).map(cell) if not df.empty else df.astype(str)
    return text.to_markdown(index=False, disable_numparse=True) + "\n"


__all__ = ["REPO_ROOT", "SOURCE_CHECKOUT", "ci95", "did_you_mean", "holm", "markdown_table", "paired_test",
           "poll_until", "repo_path", "stop_processes", "stopped", "write_json_atomic"]


@contextmanager
def native_stderr_to(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Send file descriptor 2 to ``path`` (appended, created with its folder) for the time of the
    block, then restore it. Native libraries log there behind Python's back: LiteRT's "INFO:
    Created TensorFlow Lite XNNPACK delegate for CPU." and TensorFlow's oneDNN / absl lines are
    written by their C++ loggers straight to fd 2, which ``sys.stderr`` redirection cannot catch.
    Python's own ``sys.stderr`` is flushed first, so nothing of ours is reordered or lost.

    Raises:
        OSError: ``path`` cannot be opened for appending.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(out, "ab") as f:
            os.dup2(f.fileno(), 2)
            try:
                yield out
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def hold_loop(seconds: float) -> None:
    """Hold the calling thread, an asyncio event loop's own, for ``seconds`` (s) of wall time with a
    blocking sleep (nothing for ``seconds`` <= 0): the CPU work that a slower CPU would have done
    there, which holds a one-thread event loop as long (the simulator's model handles a server's
    requests one at a time on that thread: :mod:`testbed.model.cpu`). Not ``asyncio.sleep``: the
    loop's epoll timeout is in whole ms (Python's ``selectors`` round it up), so a 0.1 ms sleep
    took 1.08 ms on this project's VMs (median of 100 timed ``await
    asyncio.sleep(0.0001)`` calls), a blocking one 0.15 ms."""
    if seconds > 0:
        time.sleep(seconds)
