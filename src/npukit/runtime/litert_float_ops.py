"""Int8 operators LiteRT's XNNPACK delegate takes in float only, rewritten in a .tflite flatbuffer to run in float
between a DEQUANTIZE and a QUANTIZE on their own int8 grids, inside the delegate.

LiteRT's converter makes an operator between a dequantization and a quantization of a PT2E program an int8 operator
where LiteRT has an int8 kernel for it. For a GELU it does (a ConvNeXt's, after each block's first pointwise layer),
but the XNNPACK delegate takes GELU only with float tensors (its type check, as for HARD_SWISH): each int8 GELU ran
in LiteRT's reference kernel between two delegate partitions (an untrained ConvNeXt-T, 96x96: 37 partitions, 18 int8
GELUs and 18 residual ADDs whose branch grid is 1e-6 of the sum's left out; written so: 1 partition, the same outputs,
25.0 -> 22.3 ms on 1 thread). Written as DEQUANTIZE -> float GELU -> QUANTIZE the operator computes the same function
of the same int8 input onto the same int8 output grid (LiteRT's int8 GELU is a table of the float function, rounded
onto the output grid; the float route rounds once, there) and XNNPACK takes all three. Read and written with the
flatbuffer schema LiteRT's own Python package ships (``ai_edge_litert``).
"""

from __future__ import annotations

from typing import Any

# builtin operators the delegate takes with float tensors only (xnnpack_delegate.cc: VisitUnaryNode's and
# VisitBinaryNode's CheckTensorFloatType groups, VisitAveragePool2DNode, VisitSoftmaxNode), of which LiteRT's
# converter may write an int8 form (Inception v3's 3x3 average pools: 6 left out, 9 partitions)
FLOAT_ONLY = ("ABS", "CEIL", "COS", "EXP", "FLOOR", "GELU", "HARD_SWISH", "LOG", "NEG", "RELU_N1_TO_1", "RELU",
              "RELU6", "ROUND", "RSQRT", "SIN", "SQRT", "SQUARE", "DIV", "MAXIMUM", "MINIMUM", "PRELU",
              "SQUARED_DIFFERENCE", "AVERAGE_POOL_2D", "SOFTMAX")
# int8 arithmetic the delegate takes only where its grids' ratio lies in [low, high): each input's scale to the
# output's for ADD and SUB, the product of the inputs' scales to the output's for MUL (xnnpack_delegate.cc's
# VisitBinaryNode); an Add of a branch scaled by 1e-6 (an untrained ConvNeXt's layer scale) to a skip is outside
SCALE_LIMITS = {"ADD": (1 / 1024, 256.0), "SUB": (1 / 1024, 256.0), "MUL": (1 / 65536, 256.0)}
_INT8_VERSION = {"DEQUANTIZE": 2, "QUANTIZE": 1}  # the operator versions that read or write int8 tensors
_OPCODE_SPLIT = 127  # builtin codes from here on are kept in builtinCode only (the schema's deprecated field says 127)


def float_islands(buffer: bytes) -> tuple[bytes, int]:
    """``buffer`` (a .tflite model) with each int8 operator of ``FLOAT_ONLY`` computed in float between a DEQUANTIZE
    of its input and a QUANTIZE onto its output's grid, and how many were; ``buffer`` itself where none is."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(buffer, 0)
    names = {_code(schema, name): name for name in (*FLOAT_ONLY, *SCALE_LIMITS)}
    rewritten = 0
    for subgraph in model.subgraphs or []:
        ops = []
        for op in subgraph.operators or []:
            name = names.get(_builtin(model.operatorCodes[op.opcodeIndex]))
            if name is not None and _int8(subgraph, op) and _refused(name, subgraph, op):
                ops.extend(_in_float(model, subgraph, op, schema))
                rewritten += 1
            else:
                ops.append(op)
        subgraph.operators = ops
    if not rewritten:
        return buffer, 0
    builder = flatbuffers.Builder(len(buffer) + 4096)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), rewritten


def _code(schema: Any, name: str) -> int:
    return int(getattr(schema.BuiltinOperator, name))


def _builtin(opcode: Any) -> int:
    return max(int(opcode.builtinCode), int(opcode.deprecatedBuiltinCode))


def _int8(subgraph: Any, op: Any) -> bool:
    from ai_edge_litert import schema_py_generated as schema

    tensors = [subgraph.tensors[i] for i in (*op.inputs, *op.outputs) if i >= 0]
    return bool(tensors) and all(t.type == schema.TensorType.INT8 and t.quantization is not None
                                 and t.quantization.scale is not None and len(t.quantization.scale) == 1
                                 for t in tensors)


def _refused(name: str, subgraph: Any, op: Any) -> bool:
    """The delegate refuses int8 operator ``op`` (a builtin ``name``): float only, or grids outside its limits."""
    if name not in SCALE_LIMITS:
        return True
    low, high = SCALE_LIMITS[name]
    scales = [float(subgraph.tensors[i].quantization.scale[0]) for i in (*op.inputs, *op.outputs)]
    *inputs, output = scales
    ratios = [inputs[0] * inputs[1] / output] if name == "MUL" else [s / output for s in inputs]
    return any(not low <= ratio < high for ratio in ratios)


def _in_float(model: Any, subgraph: Any, op: Any, schema: Any) -> list[Any]:
    """``op`` reading and writing float twins of its int8 tensors, and the DEQUANTIZE and QUANTIZE between."""
    before, after = [], []
    inputs, outputs = list(op.inputs), list(op.outputs)
    for i, index in enumerate(inputs):
        if index >= 0:
            inputs[i] = _float_twin(subgraph, index, schema)
            before.append(_operator(model, schema, "DEQUANTIZE", [index], [inputs[i]]))
    for i, index in enumerate(outputs):
        outputs[i] = _float_twin(subgraph, index, schema)
        after.append(_operator(model, schema, "QUANTIZE", [outputs[i]], [index]))
    op.inputs, op.outputs = inputs, outputs
    return [*before, op, *after]


def _float_twin(subgraph: Any, index: int, schema: Any) -> int:
    """A new float32 tensor of tensor ``index``'s shape (no data, no grid), by its index."""
    int8 = subgraph.tensors[index]
    twin = schema.TensorT()
    twin.shape, twin.shapeSignature = int8.shape, int8.shapeSignature
    twin.type, twin.buffer = schema.TensorType.FLOAT32, 0  # buffer 0: the schema's empty buffer (no constant data)
    name = int8.name.decode() if isinstance(int8.name, bytes) else str(int8.name or "")
    twin.name = f"{name}/float"
    subgraph.tensors.append(twin)
    return len(subgraph.tensors) - 1


def _operator(model: Any, schema: Any, name: str, inputs: list[int], outputs: list[int]) -> Any:
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = _opcode_index(model, schema, name), inputs, outputs
    return op


def _opcode_index(model: Any, schema: Any, name: str) -> int:
    """The model's operator code entry for builtin ``name``, added (at its int8 version) where it has none."""
    code = _code(schema, name)
    for i, opcode in enumerate(model.operatorCodes):
        if _builtin(opcode) == code:
            return i
    opcode = schema.OperatorCodeT()
    opcode.builtinCode, opcode.deprecatedBuiltinCode = code, min(code, _OPCODE_SPLIT)
    opcode.version = _INT8_VERSION[name]
    model.operatorCodes.append(opcode)
    return len(model.operatorCodes) - 1
