"""The experiment scripts (run as scripts, or imported: ``python -m experiments.compare``)."""
