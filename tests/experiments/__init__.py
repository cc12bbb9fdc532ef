"""The experiments (``experiments/``, run as ``python -m experiments.X``): quick runs, JSON."""
