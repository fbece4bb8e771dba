"""An ONNX model as a torch program, for the verbs that carry npukit's plan onto one (compile for ExecuTorch, LiteRT
and Core ML, and optimize on them), which took PyTorch models only.

The graph is fixed at the input shape the verb runs it at and cleaned as ``npukit optimize-graph`` cleans it
(constants and BatchNorms folded, dead code gone: a shape computed from the input becomes the constant it is), then
run node by node on torch by ``npukit.quant.qat.program.OnnxProgram``, the program QAT trains, with its constants
kept readable by ``torch.export`` (a Reshape's shape, a Clip's bounds are numbers in the exported program). Before
anything is built on it, the program is checked against ONNX Runtime running the original graph (no graph
optimizations) on seeded inputs: within ``TOLERANCE`` of each output's range, else the model is refused (exit 2),
naming the output and the error. The verbs then treat it as the user's torch module: exported, planned on its ONNX
export, lowered and checked against it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from npukit.errors import InputError
from npukit.frontend._messages import first_line

TOLERANCE = 1e-4  # torch program against ONNX Runtime: max abs error over each output's range (compile's fp32 check)
CHECK_SAMPLES = 2
SEED = 0
HINT = "give the PyTorch model, or compile the ONNX model with --target qnn-htp"


def torch_program(model: onnx.ModelProto, shape: tuple[int, ...], *, label: str) -> tuple[Any, str]:
    """(``model`` at input ``shape`` as a torch module in eval mode, a note for the report saying how it was made and
    how far it is from ONNX Runtime); an InputError where the graph has more than one input, an input that is not
    float, an operator npukit has no torch form of, or where the program does not match ONNX Runtime."""
    from npukit.frontend.shapes import fix_input_shape

    require_one_float_input(model, label)
    fixed = fix_input_shape(model, tuple(shape), dynamic_batch=False)
    cleaned = _cleaned(fixed)
    program = _program(cleaned, label)
    errors = _check(program, fixed, tuple(shape), label)
    note = (f"{label} runs as a torch program built from its ONNX graph ({len(cleaned.graph.node)} nodes after "
            f"constant folding; npukit's ONNX operators in torch): max abs error {errors.max_rel:.2g} of the output "
            f"range against ONNX Runtime on the original graph, {CHECK_SAMPLES} seeded inputs")
    if errors.runtime_allowance:
        moved = max(a / 2 / s for a, s in zip(errors.runtime_allowance, errors.scales) if s > 0)
        note += (f" (over {TOLERANCE:g}, within twice what ONNX Runtime's own graph optimizations move the outputs "
                 f"by: {moved:.2g} of the range; the model's float arithmetic is that sensitive)")
    return program, note


def require_one_float_input(model: onnx.ModelProto, label: str) -> None:
    """An InputError unless ``model`` has one graph input, a float one (what a torch program is built from)."""
    from npukit.frontend.shapes import runtime_inputs

    inputs = runtime_inputs(model)
    if len(inputs) != 1:
        raise InputError(f"{label} has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); npukit builds a "
                         "torch program from an ONNX model with one input",
                         hint=HINT)
    if inputs[0].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        kind = onnx.TensorProto.DataType.Name(inputs[0].type.tensor_type.elem_type).lower()
        raise InputError(f"{label}'s input {inputs[0].name} is {kind}; npukit builds a torch program from an ONNX "
                         "model with one float input", hint="give the PyTorch model")


def program_graph(model: onnx.ModelProto, shape: tuple[int, ...]) -> onnx.ModelProto:
    """The graph a torch program runs: ``model`` (one input) at ``shape``, cleaned, and every node computed from
    constants alone evaluated, as the program does outside tracing (``OnnxProgram``'s folds: a ConstantOfShape the
    cleaning keeps is a constant in the exported program). What analyze predicts the mobile runtimes on."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    from npukit.frontend.shapes import fix_input_shape

    cleaned = _cleaned(fix_input_shape(model, tuple(shape), dynamic_batch=False))
    graph = cleaned.graph
    constants = {t.name: t for t in graph.initializer}
    opsets = {o.domain or "": o.version for o in cleaned.opset_import}
    kept = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or not node.input or any(n and n not in constants for n in node.input):
            kept.append(node)
            continue
        try:
            outs = ReferenceEvaluator(node, opsets=opsets).run(
                None, {n: numpy_helper.to_array(constants[n]) for n in node.input if n})
        except Exception:  # noqa: BLE001 - what the evaluator cannot run is analyzed as a node
            kept.append(node)
            continue
        for name, value in zip(node.output, outs):
            constants[name] = numpy_helper.from_array(np.asarray(value), name)
            graph.initializer.append(constants[name])
    del graph.node[:]
    graph.node.extend(kept)
    return cleaned


def _cleaned(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` through optimize-graph's default passes (checked against ``model`` later, with the program), each
    layer keeping a weight of its own: the plan carried onto the program matches weights one layer at a time."""
    import onnx_ir as ir

    from npukit.config import OptimizeConfig
    from npukit.passes.pipeline import optimize_model

    ir_model = ir.serde.deserialize_model(model)
    config = OptimizeConfig(skip_passes=("share_initializers",))
    return ir.serde.serialize_model(optimize_model(ir_model, config=config).model)


def _program(model: onnx.ModelProto, label: str) -> Any:
    from npukit.quant.qat.program import OnnxProgram, unsupported_ops

    missing = unsupported_ops(model)
    if missing:
        from npukit.frontend.onnx_io import quantized_ops

        integer = sorted(set(missing) & set(quantized_ops(model)))
        raise InputError(f"{label} has operators npukit cannot run as torch: {', '.join(missing)}", hint=(
            f"it is quantized already ({', '.join(integer)}), and the HTP takes no such ops either: bench it as it "
            "is (`npukit bench MODEL --data ...`: ORT CPU runs them), or start from its float original"
            if integer else HINT))
    program = OnnxProgram(model, constants=True, use=f"a torch program built from {label}", hint=HINT).eval()
    for parameter in program.parameters():
        parameter.requires_grad_(False)
    return program


def _check(program: Any, model: onnx.ModelProto, shape: tuple[int, ...], label: str) -> Any:
    """The program's output errors against ONNX Runtime on ``model`` (``OutputErrors``), over
    ``CHECK_SAMPLES`` seeded inputs; an InputError where an output is off by more than ``TOLERANCE`` of its range and
    more than twice what ORT's own graph optimizations move it by (a float32 sum taken in another order: on a deep
    U-Net at 1024 x 1024, ORT optimized against ORT unoptimized 4.3e-3 of the range, the torch program 2.0e-4)."""
    import dataclasses

    import torch

    from npukit.frontend.verify import seeded_samples
    from npukit.measure.compare import compare_outputs, stacked_runs
    from npukit.passes.pipeline import optimization_allowance
    from npukit.runtime.ort import make_session

    session = make_session(model, optimization="disable")
    name = session.get_inputs()[0].name
    inputs = seeded_samples(shape, samples=CHECK_SAMPLES, seed=SEED)
    references = [session.run(None, {name: x}) for x in inputs]
    got = []
    for x in inputs:
        with torch.no_grad():
            try:
                got.append([np.asarray(t.detach().numpy(), dtype=np.float32) for t in program(torch.from_numpy(x))])
            except InputError:
                raise
            except Exception as exc:  # noqa: BLE001 - an op npukit's torch form runs differently: refused, named
                raise InputError(f"{label} does not run as a torch program: {type(exc).__name__}: {first_line(exc)}",
                                 hint=HINT) from None
    errors = compare_outputs(stacked_runs(references), stacked_runs(got))
    if errors.failing(TOLERANCE):  # the control: ORT against itself, its optimizations on
        allowance = optimization_allowance(model, [{name: x} for x in inputs], references)
        errors = dataclasses.replace(errors, runtime_allowance=allowance)
    bad = errors.failing(TOLERANCE)
    if bad:
        k = bad[0]
        raise InputError(f"{label}'s torch program differs from ONNX Runtime on output {model.graph.output[k].name}: "
                         f"max abs error {errors.per_output[k][0]:.3g} against a range of {errors.scales[k]:.3g} "
                         f"(allowed {errors.allowed(k, TOLERANCE):.3g}: {TOLERANCE:g} of it, and twice what ORT's "
                         "graph optimizations move it by): an npukit limitation", hint=HINT)
    return errors
