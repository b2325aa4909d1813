"""Benchmarks: memory, throughput, rehydration and end-to-end latency, each beside the naive way.

Run with `make bench` (full) or `make bench-quick` (smoke, under a minute each). Never part of
`make test`: performance claims come from the figures these print, not from timed asserts.
"""
