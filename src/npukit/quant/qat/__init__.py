"""Quantization-aware training: a QDQ model's twin trained in torch on the plan's own grids, written back as QDQ."""
