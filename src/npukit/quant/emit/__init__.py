"""Emitters: a quantization plan to an artifact (ONNX QDQ through ONNX Runtime's quantizer today)."""
