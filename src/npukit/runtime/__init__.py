"""npukit.runtime."""
