"""The emulation engine: Mininet network, link emulators, OVS, events, servers, health watch, query
sources, packet capture, cleanup, and the run that ties them (the model on the wall clock).
"""
