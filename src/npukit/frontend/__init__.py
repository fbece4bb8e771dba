"""npukit.frontend."""
