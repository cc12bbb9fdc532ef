"""Flower ServerApp (issue 3)."""
