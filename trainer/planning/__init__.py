"""The planner: memory model, budget, search, reasons, alternatives, ``plan --measure``, the OOM ladder.
No torch."""
