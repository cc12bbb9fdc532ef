"""Fixture Flower apps shaped like Flower's own examples, on offline data (tests only)."""
