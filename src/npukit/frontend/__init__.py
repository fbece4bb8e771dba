"""Frontend: resolve a model spec (spec.py), export torch to ONNX (export.py), read/write ONNX (onnx_io.py), verify."""
