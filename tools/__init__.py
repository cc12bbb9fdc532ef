"""Project tools that are not experiments: the doc generator (``python -m tools.make_docs``,
renderers in ``tools/docgen/``), the mutation runner (``python -m tools.mutation``, its verdicts
in ``tools/mutation_reasons.py``) and the test-isolation check (``python -m tools.tests_alone``).
"""
