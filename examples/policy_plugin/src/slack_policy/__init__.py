"""A deadline-slack policy for the ASET testbed, installed as a plug-in (``slack_policy.policy:slack``)."""
