"""The project's own app: run config, datasets, models and training (``fl_gradcode.learning``)."""
