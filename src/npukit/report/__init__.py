"""npukit.report."""
