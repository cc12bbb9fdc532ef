"""Project tools that are not experiments: the doc generator (``python -m tools.make_docs``,
renderers in ``tools/docgen/``) and the mutation runner (``python -m tools.mutation``)."""
