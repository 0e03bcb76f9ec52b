"""From an experiment to the one :class:`~testbed.plan.build.Plan` both engines read: topology, zoo
catalogue, service times, events, weights, and the per-process boundary files.
"""
