"""npukit.data."""
