"""The Flower layer (``fl_gradcode.flower``), run in-process on ``InProcessGrid``."""
