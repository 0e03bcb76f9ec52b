"""The error root of the testbed and the exit codes of the ``testbed`` command.

Every error the testbed raises on purpose derives from :class:`TestbedError`, which carries the
exit code the command returns for it; :func:`testbed.cli.main.main` catches it once and prints its
message as plain text (never console markup: messages quote file contents and names).

Exit codes (documented in README.md):

==== ===============================================================================
code meaning
==== ===============================================================================
0    success: the run measured queries and every component stayed up (or went down as planned)
2    invalid input (experiment, topology, plan, model zoo, bad arguments): nothing was built
3    a precondition or a self-check failed, or a component did not come up (bring-up)
4    a component died during the run (source, server, link emulator, ryu-manager, OVS, ...)
5    the run measured nothing (no query was recorded)
6    every query of the run failed, whatever the cause; the summary's headline says why
7    a model failed its integrity check: a file's SHA-256 differs from the zoo's record (or the zoo
     records none), or a server's labelled start-up sample answered far below the model's
     accuracy; the message names the file (the one code of every integrity failure)
130  interrupted (Ctrl-C / SIGTERM); what was measured so far is kept
==== ===============================================================================
"""

from __future__ import annotations

import errno

EXIT_OK = 0
EXIT_INPUT = 2
EXIT_BRINGUP = 3
EXIT_COMPONENT_DIED = 4
EXIT_NOTHING_MEASURED = 5
EXIT_ALL_FAILED = 6
EXIT_INTEGRITY = 7
EXIT_INTERRUPTED = 130


class TestbedError(Exception):
    """Base of every error the testbed raises on purpose; ``exit_code`` is what the CLI returns."""

    __test__ = False  # not a pytest test class, despite the name
    exit_code: int = EXIT_BRINGUP


class InputError(TestbedError, ValueError):
    """Bad input: the message names the offending item; nothing was built (exit code 2)."""

    exit_code = EXIT_INPUT


class RunFailure(TestbedError, RuntimeError):
    """A precondition, a component or a self-check failed (exit code 3 unless set otherwise)."""

    exit_code = EXIT_BRINGUP

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


#: What a connection error's errno says about the path (:func:`connect_error`).
ERRNO_MEANING = {
    "EHOSTUNREACH": "the source's neighbour entry for the cluster failed (ARP unanswered)",
    "ECONNREFUSED": "nothing listens on the server's port at the cluster's address",
    "ENETUNREACH": "the source has no route to the cluster's address",
    "ECONNRESET": "the server reset the connection",
}


def connect_error(exc: BaseException) -> str:
    """A client error with its errno named: ``ClientConnectorError: EHOSTUNREACH (meaning): text``.
    aiohttp's message keeps only asyncio's ``Connect call failed (ip, port)``, which reads the same
    for a refused connection and an unanswered ARP."""
    os_err = getattr(exc, "os_error", exc)
    code = getattr(os_err, "errno", None)
    name = errno.errorcode.get(code, "") if isinstance(code, int) else ""
    what = f"{name} ({ERRNO_MEANING[name]}): " if name in ERRNO_MEANING else (f"{name}: " if name else "")
    return f"{type(exc).__name__}: {what}{exc}"


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` with its noun in the right number: ``counted(1, "source")`` is "1 source",
    ``counted(3, "policy", "policies")`` is "3 policies" (default plural: ``noun + "s"``)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def naming_file(exc: TestbedError, path: object) -> TestbedError:
    """``exc`` (the same class and exit code) with its message led by ``path``, the file it came
    from, unless the message names that file already: an error found while planning one of several
    files (a sweep, the training scenarios) says which."""
    import copy

    text = str(exc)
    if str(path) in text:
        return exc
    out = copy.copy(exc)
    out.args = (f"{path}: {text}", *exc.args[1:])
    return out


__all__ = ["EXIT_ALL_FAILED", "EXIT_BRINGUP", "EXIT_COMPONENT_DIED", "EXIT_INPUT", "EXIT_INTEGRITY", "EXIT_INTERRUPTED",
           "EXIT_NOTHING_MEASURED", "EXIT_OK", "InputError", "RunFailure", "TestbedError", "counted", "naming_file"]
