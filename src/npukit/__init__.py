"""npukit: PyTorch/ONNX -> fast, small, verified artifacts for phones and NPUs, with the numbers to prove it."""

__version__ = "0.1.0"

from npukit.api import bench, demo, export, inspect, optimize_graph  # noqa: E402

__all__ = ["__version__", "bench", "demo", "export", "inspect", "optimize_graph"]
