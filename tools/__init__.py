"""Project tools that are not experiments: the doc generator (``python -m tools.make_docs``,
renderers in ``tools/docgen/``), the mutation runner (``python -m tools.mutation``, an optional
diagnostic; its presets in ``tools/mutation_map.toml``) and the test-isolation check
(``python -m tools.tests_alone``).
"""
