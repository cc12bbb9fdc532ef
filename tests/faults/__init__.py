"""The seeded fault suite over the public API (``fault_injection``; its scenarios and oracle
``fault_scenarios``, injector ``fault_injector``, invariants ``fault_invariants``, edge kinds
``fault_kinds`` and rewritten replies ``fault_replies``) and its tests (``test_fault_injection``,
``test_fault_edges``, their targeted scenarios in ``fault_cases``). The full run writes
``results/fault_injection.json``: ``python -m tests.faults.fault_injection --full``."""
