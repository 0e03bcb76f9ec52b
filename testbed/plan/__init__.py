"""From an experiment to the one :class:`~testbed.plan.resolved.Plan` both engines read.

:mod:`~testbed.plan.build` (``build_plan``: the list of steps), :mod:`~testbed.plan.resolved` (the
plan), :mod:`~testbed.plan.network_layout`, :mod:`~testbed.plan.event_resolution`, :mod:`~testbed.plan.workload`,
:mod:`~testbed.plan.cluster_figures`, :mod:`~testbed.plan.checks`, :mod:`~testbed.plan.capture_points`,
:mod:`~testbed.plan.policy_resolution` and :mod:`~testbed.plan.policy_plugins` (policies of one's own: imported
here, so that every process that plans or runs has the policy registry's plug-in hook); the zoo's
inventory, profiles and handling figures (:mod:`~testbed.plan.zoo`, :mod:`~testbed.plan.profiles`,
:mod:`~testbed.plan.handling_profiles`) read by the :mod:`~testbed.plan.catalog`; and the per-process boundary
files (:mod:`~testbed.plan.boundaries`).
"""

from testbed.plan import policy_plugins  # noqa: F401,E402 - installs how the policy registry resolves plug-ins
