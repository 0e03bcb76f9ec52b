"""The inference server (HTTP, scheduler threads over the model's queue), the model zoo, payloads and the
profiler.
"""
