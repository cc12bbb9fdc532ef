"""Renderers of the generated blocks of README.md and docs/ (driver: experiments/make_docs.py)."""
