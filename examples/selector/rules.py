"""A rule-based selector (the class form of ``aset.selector``; docs/extending.md, "A selector of your own").

``SuccessGuard`` keeps a source on ``base`` (``closest``: the lowest RTT) while the queries it saw
resolved succeed, and switches it to ``fallback`` (``least_loaded``) for ``hold`` windows as soon as
the success ratio of the window (the worst application's) drops below ``threshold``. It reads only
the observation's success block (:meth:`testbed.agent.selector.Observation.success`)::

    aset:
      selector: {use: examples.selector.rules:SuccessGuard, params: {threshold: 0.9, hold: 4}}
"""

from __future__ import annotations


class SuccessGuard:
    """``select(obs)`` -> a policy name, once per window.

    Args:
        threshold: the success ratio (0..1) under which the source leaves ``base``.
        hold: windows to stay on ``fallback`` after the last drop (>= 1).
        base, fallback: policy names of the action space.

    Raises:
        ValueError: a threshold outside [0, 1] or a hold below 1.
    """

    def __init__(self, threshold: float = 0.9, hold: int = 4, base: str = "closest", fallback: str = "least_loaded"):
        if not 0.0 <= threshold <= 1.0 or hold < 1:
            raise ValueError(f"threshold {threshold} must be in [0, 1] and hold {hold} >= 1")
        self.threshold, self.hold, self.base, self.fallback = float(threshold), int(hold), base, fallback
        self.left = 0

    def reset(self) -> None:
        """Before the first window: on ``base``."""
        self.left = 0

    def select(self, obs) -> str:
        worst = min(obs.success().values(), default=1.0)
        if worst < self.threshold:
            self.left = self.hold
        elif self.left:
            self.left -= 1
        return self.fallback if self.left else self.base


def alternate(obs, first: str = "closest", second: str = "least_loaded") -> str:
    """The plain-callable form: ``first`` on even windows, ``second`` on odd ones (a selector that
    shows its decisions in the records; ``obs.window`` counts the windows ended)."""
    return first if obs.window % 2 == 0 else second
