"""End to end: Flower's simulation and deployment engines, the launcher, the shipped example."""
