"""The other maths modules: latency models, differential privacy, coded matrix multiplication."""
