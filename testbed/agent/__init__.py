"""The ASET agent as it runs: observation, the numpy forward pass of an exported checkpoint, and the
live selector the dispatchers call each window. Training and evaluation are in :mod:`testbed.aset`.
"""
