"""The experiment scripts (``experiments/``) and the fault suite."""
