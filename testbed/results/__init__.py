"""What a run leaves: records, summaries, reports, packet-capture analysis, and sweeps over runs.
"""
