"""npukit.measure."""
