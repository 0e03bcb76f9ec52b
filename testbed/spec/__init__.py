"""What a user writes: units, the strict YAML loader, the experiment, topology input, events' YAML form,
server and capture specs, the ASET config. Pydantic models; imports only :mod:`testbed.core`.
"""
