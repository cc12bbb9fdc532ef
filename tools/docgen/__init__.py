"""Renderers of the generated blocks of README.md and docs/ (driver: tools/make_docs.py)."""
