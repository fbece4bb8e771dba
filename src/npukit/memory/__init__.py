"""npukit.memory."""
