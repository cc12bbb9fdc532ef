"""Flower ClientApp (issue 3)."""
