"""The ``testbed`` command and its subcommands.
"""
