"""The seeded fault suite over the public API (``fault_injection``, its edge kinds
``fault_kinds`` and rewritten replies ``fault_replies``) and its tests. The full run writes
``results/fault_injection.json``: ``python -m tests.faults.fault_injection --full``."""
