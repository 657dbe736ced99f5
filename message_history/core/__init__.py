"""The pure rules: recall merge and dedupe, the persistence filter, token budgets, tool state, turn ordering.

No I/O and no driver: these modules import only the standard library, `schemas` and the ground modules
(`message_history.errors`, `settings`, `logs`, `metrics`, `tracing`). The layers above apply them.
"""
