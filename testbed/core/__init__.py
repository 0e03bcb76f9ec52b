"""The base layer: errors and exit codes, file and process helpers, the parent-death lifeline, cgroups, and
the process-pool / Ray fan-out. Imports nothing else of ``testbed``.
"""
