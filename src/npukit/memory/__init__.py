"""npukit.memory: activation lifetimes, execution views per target, offset planners, execution order search and
ORT's measured peak. ``plan.plan_memory`` is the entry point behind ``npukit plan-memory``."""
