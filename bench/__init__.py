"""Reproducible load benchmarks of agenthost, run through the real daemon socket (issue 10).

Each `bench.<name>` module prints its tables and the exact command that reproduces them;
`python -m bench.run_all` runs them all and writes `bench/results/<date>.json` and PNG plots.
"""
