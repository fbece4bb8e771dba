"""Precision choices: which tensors go to 16 bits within a latency budget, per-layer sensitivity, joins of mixed scales kept in float."""
