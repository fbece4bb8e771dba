"""npukit.quant: INT8 post-training quantization.

config (QuantConfig) -> observers (streaming ranges) -> calibrate (ORT CPU, one sample at a time) -> equalize
(cross-layer equalization, high-bias absorption) -> bias_correction -> qdq (``quantize``: Q/DQ placement through ONNX
Runtime with our ranges, ``integer_kernel_report``) -> layer_sqnr (which layer hurts).
"""
