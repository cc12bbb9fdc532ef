"""fl-gradcode: gradient coding for straggler-tolerant federated learning.

The maths lives in :mod:`fl_gradcode.codes` (numpy/scipy only, no Flower import).
"""

__version__ = "0.1.0"
