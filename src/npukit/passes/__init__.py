"""npukit.passes."""
