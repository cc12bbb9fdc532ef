"""The experiments: benchmarks and figures on fl_gradcode's public API, run as modules from the
repository root (``python -m experiments.compare``, ``python -m experiments.run_all``,
``python -m experiments.<name>``); each writes JSON (and PNG) into ``results/``."""
