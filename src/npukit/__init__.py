"""npukit: PyTorch/ONNX -> fast, small, verified artifacts for phones and NPUs."""

__version__ = "0.1.0"
