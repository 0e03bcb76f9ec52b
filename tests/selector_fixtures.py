"""Selectors the selector plug-in tests name (``aset.selector.use: selector_fixtures:...``):
importable with tests/ on the path (pytest puts it there; the emulation test passes it in PYTHONPATH)."""

from __future__ import annotations


class Cycle:
    """Class form: ``policies[k % len]`` at the k-th decision (k counted from ``reset``)."""

    def __init__(self, policies: list[str]):
        self.policies = list(policies)
        self.k = -1

    def reset(self) -> None:
        self.k = 0

    def select(self, obs) -> str:
        if self.k < 0:
            raise RuntimeError("select before reset")
        name = self.policies[self.k % len(self.policies)]
        self.k += 1
        return name


def by_index(obs, every: int = 1) -> int:
    """Callable form: an action index, the next one every ``every`` windows."""
    return (obs.window // every) % len(obs.policies)


class FailsAt:
    """Raises ZeroDivisionError at decision ``at`` (after ``at`` good ones)."""

    def __init__(self, at: int = 3):
        self.at, self.k = at, 0

    def select(self, obs) -> str:
        self.k += 1
        if self.k > self.at:
            return 1 // 0
        return "closest"


class NoSelect:
    """Not a selector: no ``select``."""

    def choose(self, obs) -> str:
        return "closest"


def two_args(obs, other) -> str:
    """Not a selector: takes two observations."""
    return "closest"


def out_of_range(obs) -> int:
    """Returns an index outside the action space."""
    return 99


NOT_CALLABLE = 42
