"""The system model (``docs/system-model.md``): queue, admission, batching, CPU quota, service time,
dispatcher, policies, arrivals, routing, network time, events' timeline, records and outcome rule.
Pure code with no I/O and no clock of its own: both engines call it with the time as an argument.
"""

from testbed.model import event_kinds  # noqa: F401 - registers the built-in event kinds (testbed.model.timeline)
