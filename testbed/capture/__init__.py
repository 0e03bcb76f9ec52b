"""Packet capture in the emulated namespaces and per-hop, per-query packet analysis."""
