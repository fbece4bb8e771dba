"""npukit.targets."""
