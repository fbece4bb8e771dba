"""npukit.quant."""
