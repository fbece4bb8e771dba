"""Calibration: streaming observers (min-max, percentile, entropy, MSE), the calibration pass over the samples, and the automatic choice among the methods."""
