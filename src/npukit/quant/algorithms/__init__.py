"""Accuracy-recovery algorithms on the float model and its grids: cross-layer and activation equalization, bias correction, AdaRound, range search."""
