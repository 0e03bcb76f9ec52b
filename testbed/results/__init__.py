"""What a run leaves, and running one end to end: ``runs`` (an engine, then the merge, the summary
and the exit code), ``records`` (reading, merging, checking the records), ``figures`` and ``render``
(what a summary computes, and its text), ``summary`` (the two together), ``report`` and ``plots``,
``capture`` (packet-capture analysis), ``sweep`` (sweeps over runs).
"""
