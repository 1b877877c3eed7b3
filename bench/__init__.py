"""Benchmark harness: times the stages and the peer implementations side by side in one process.

``python -m bench`` checks every arm against a float64 reference, times the correct ones with L2
flushed and the arm order alternated, and writes bench/results/<gpu-slug>.json through
hopattn.records.results. See ``python -m bench --help``.
"""
