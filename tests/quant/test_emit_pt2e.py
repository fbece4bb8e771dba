"""npukit's plan carried onto a torch program (PT2E): the converted program's grids and weight integers are the
QDQ model's, and it computes what the QDQ model computes (ORT with no fusions: the Q/DQ arithmetic as written)."""

from __future__ import annotations

import operator
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

pytest.importorskip("executorch", reason="the executorch extra is not installed (scripts/setup.sh installs it)")

from npukit.config import ExportConfig  # noqa: E402
from npukit.frontend.export import export_model  # noqa: E402
from npukit.frontend.spec import ModelSource  # noqa: E402
from npukit.quant.config import CalibrationSpec, QuantConfig, Recipe, Scheme  # noqa: E402
from npukit.quant.emit.pt2e import carry_plan  # noqa: E402
from npukit.quant.grids import qdq_grids, same_weight, unplanned_grids  # noqa: E402
from npukit.quant.qdq import quantize  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from tinynet import tiny  # noqa: E402


def _setup(tmp_path: Path, config: QuantConfig):
    module = tiny()
    source = ModelSource(kind="torch", spec="tinynet:tiny", module=module, onnx_path=None,
                         default_input_shape=(1, 3, 32, 32), description="tiny CNN")
    path = export_model(source, tmp_path / "tiny.onnx", config=ExportConfig(input_shape=(1, 3, 32, 32))).path
    float_onnx = onnx.load(str(path))
    rng = np.random.default_rng(0)
    samples = [{"input": rng.normal(size=(1, 3, 32, 32)).astype(np.float32)} for _ in range(12)]
    result = quantize(float_onnx, samples, config=config)
    example = (torch.from_numpy(samples[0]["input"].copy()),)
    carried = carry_plan(module, example, float_model=float_onnx, qdq=result.model, plan=result.plan)
    return module, result, carried, samples


def _program_grids(program: torch.fx.GraphModule) -> tuple[set[tuple[float, int]], list[tuple[np.ndarray, np.ndarray]]]:
    def value(arg):
        return getattr(program, arg.target) if isinstance(arg, torch.fx.Node) and arg.op == "get_attr" else arg

    grids, weights = set(), []
    for node in program.graph.nodes:
        name = str(node.target)
        if "quantize_per_tensor" in name and "dequantize" not in name:
            grids.add((round(float(value(node.args[1])), 9), int(value(node.args[2]))))
        elif "dequantize_per_channel" in name:
            weights.append((value(node.args[0]).numpy(), value(node.args[1]).numpy().reshape(-1)))
    return grids, weights


def test_the_program_has_the_plans_grids_and_weight_integers(tmp_path):
    _, result, carried, _ = _setup(tmp_path, QuantConfig(scheme=Scheme(activation_dtype="int8"),
                                                         calibration=CalibrationSpec(method="minmax"),
                                                         recipe=Recipe(bias_correction=True)))
    assert carried.unmatched == ()
    assert carried.weights == 4  # every conv and the linear layer
    planned_grids, qdq_weights = qdq_grids(result.model)
    grids, weights = _program_grids(carried.program)
    derived = len(carried.derived)  # the logits: float in the ONNX model, int8 on the plan's range in XNNPACK's
    # every grid of the program is one of the QDQ model's (a tensor only ONNX has, inside a decomposed HardSwish,
    # has a grid the program does not need)
    assert len(grids - planned_grids) <= derived and len(grids & planned_grids) >= 5
    assert len(weights) == len(qdq_weights)
    for ints, scales in weights:
        twins = [w for w, s in qdq_weights if w.shape == ints.shape and np.allclose(s, scales, rtol=1e-6)]
        assert any(np.array_equal(w, ints) for w in twins), "a weight's integers differ from the plan's"


def test_the_program_computes_what_the_qdq_model_computes(tmp_path):
    _, result, carried, samples = _setup(tmp_path, QuantConfig(scheme=Scheme(activation_dtype="int8"),
                                                               calibration=CalibrationSpec(method="minmax"),
                                                               recipe=Recipe(cle=True)))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # Q/DQ arithmetic as written
    session = ort.InferenceSession(result.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for feeds in samples[:4]:
        want = session.run(None, feeds)[0]
        with torch.no_grad():
            got = carried.program(torch.from_numpy(feeds["input"].copy())).numpy()
        # the same grids: differences are float rounding that flips a level now and then, and the logits' grid
        sqnr = 10 * np.log10(np.sum(want ** 2) / max(np.sum((want - got) ** 2), 1e-30))
        assert sqnr > 30, sqnr


def test_a_node_the_plan_keeps_in_float_stays_float(tmp_path):
    _, result, _, _ = _setup(tmp_path, QuantConfig(scheme=Scheme(activation_dtype="int8"),
                                                   calibration=CalibrationSpec(method="minmax")))
    first_conv = next(n.name for n in result.reference.graph.node if n.op_type == "Conv")
    _, result, carried, _ = _setup(tmp_path, QuantConfig(scheme=Scheme(activation_dtype="int8", exclude=(first_conv,)),
                                                         calibration=CalibrationSpec(method="minmax")))
    assert carried.unmatched == ()
    assert carried.float_nodes, "the excluded conv was quantized in torch"
    # three on the plan's integers; the float conv's are carried as the plan's model has them, not counted (Core
    # ML's read-back compares the package's int8 weights with this count: PP-OCR's angle classifier, its stem in
    # the float head, failed with 53 int8 weights where 54 were counted)
    assert carried.weights == 3


@pytest.mark.parametrize("which", [1, 2])
def test_a_float_conv_keeps_the_weights_equalization_gave_it(tmp_path, which):
    """CLE scales a conv's output channels and the next conv's input channels together: a conv the plan keeps in
    float must take its scaled weights too, or the program computes another function (MobileNetV2 under CLE with a
    float projection conv: -1.8 dB against the float model, where the QDQ model had 13 dB)."""
    config = QuantConfig(scheme=Scheme(activation_dtype="int8"),
                         calibration=CalibrationSpec(method="minmax"),
                         recipe=Recipe(cle=True))
    _, result, _, _ = _setup(tmp_path, config)
    conv = [n.name for n in result.reference.graph.node if n.op_type == "Conv"][which]
    _, result, carried, samples = _setup(tmp_path, config.with_scheme(exclude=(conv,)))
    assert carried.unmatched == () and carried.float_nodes

    def run(feeds):
        with torch.no_grad():
            return [carried.program(torch.from_numpy(feeds["input"].copy())).numpy()]

    _assert_computes_the_qdq_model(result.model, run, samples[:4], floor_db=30)


def _tflite_grids(buffer: bytes) -> tuple[set[tuple[float, int]], list[tuple[np.ndarray, np.ndarray]]]:
    """Activation grids (per-tensor int8: the input and what ops write) and constant int8 weights (integers,
    per-channel scales) of a .tflite; other constants (a scalar the converter quantized) are neither."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=buffer)
    interpreter.allocate_tensors()
    ops = interpreter._get_ops_details()
    weights_at = {int(op["inputs"][1]) for op in ops if op["op_name"] in ("CONV_2D", "DEPTHWISE_CONV_2D",
                                                                           "FULLY_CONNECTED")}
    written = {int(t) for op in ops for t in op["outputs"]} | {d["index"] for d in interpreter.get_input_details()}
    grids, weights = set(), []
    for detail in interpreter.get_tensor_details():
        params = detail["quantization_parameters"]
        if detail["dtype"] != np.int8 or not len(params["scales"]):
            continue
        if detail["index"] in weights_at:
            weights.append((interpreter.get_tensor(detail["index"]), params["scales"]))
        elif detail["index"] in written:
            grids.add((round(float(params["scales"][0]), 9), int(params["zero_points"][0])))
    return grids, weights


def test_the_litert_model_has_the_plans_grids_and_weight_integers(tmp_path):
    """LiteRT's .tflite from the carried plan (weights' quantize ops kept, averages on their input's grid): its
    integer weights and scales are the plan's, its activation grids the QDQ model's, and it computes what the
    QDQ model computes."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert

    module = tiny()
    source = ModelSource(kind="torch", spec="tinynet:tiny", module=module, onnx_path=None,
                         default_input_shape=(1, 3, 32, 32), description="tiny CNN")
    float_onnx = onnx.load(str(export_model(source, tmp_path / "tiny.onnx",
                                            config=ExportConfig(input_shape=(1, 3, 32, 32))).path))
    rng = np.random.default_rng(0)
    samples = [{"input": rng.normal(size=(1, 3, 32, 32)).astype(np.float32)} for _ in range(12)]
    result = quantize(float_onnx, samples, config=QuantConfig(scheme=Scheme(activation_dtype="int8"),
                                                              calibration=CalibrationSpec(method="minmax"),
                                                              recipe=Recipe(cle=True)))
    example = (torch.from_numpy(samples[0]["input"].copy()),)
    carried = carry_plan(module, example, float_model=float_onnx, qdq=result.model, plan=result.plan,
                         options=litert.CARRY)
    lowered = litert.lower(carried.program, example)
    planned_grids, qdq_weights = qdq_grids(result.model)
    grids, weights = _tflite_grids(lowered.buffer)
    assert len(weights) == len(qdq_weights) == 4
    for ints, scales in weights:  # LiteRT's layouts differ (OHWI, 1HWC): the same integers, the same scales
        twins = [w for w, s in qdq_weights if w.size == ints.size and np.allclose(s, scales, rtol=1e-6)]
        assert any(np.array_equal(np.sort(w, axis=None), np.sort(ints, axis=None)) for w in twins), \
            "a weight's integers or scales differ from the plan's"
    inner = {(round(scale, 9), zero) for scale, zero in lowered.inner_grids}  # its hardswish as int8 MUL/ADD/MUL
    assert len(inner) == 2 and len(grids - planned_grids - inner) <= len(carried.derived) \
        and len(grids & planned_grids) >= 5, (grids, planned_grids, inner)
    path = tmp_path / "tiny.tflite"
    path.write_bytes(lowered.buffer)
    _assert_computes_the_qdq_model(result.model, litert.Runner(path), samples[:4], floor_db=30)


def _assert_computes_the_qdq_model(qdq: onnx.ModelProto, runner, samples, *, floor_db: float) -> None:
    """``runner``'s first output within ``floor_db`` SQNR of the QDQ model's on ORT with no fusions (its Q/DQ
    arithmetic as written)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(qdq.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for feeds in samples:
        want, got = session.run(None, feeds)[0], runner(feeds)[0]
        sqnr = 10 * np.log10(np.sum(want ** 2) / max(np.sum((want - got) ** 2), 1e-30))
        assert sqnr > floor_db, sqnr


class _Fire(torch.nn.Module):
    """SqueezeNet's fire module: two conv branches concatenated (LiteRT's CONCATENATION wants one scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.squeeze = torch.nn.Conv2d(3, 8, 1)
        self.left = torch.nn.Conv2d(8, 8, 1)
        self.right = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.head = torch.nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.squeeze(x))
        x = torch.cat([torch.relu(self.left(x)), torch.relu(self.right(x))], 1)
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _exported_16x16(tmp_path: Path, net: type[torch.nn.Module]):
    """``net`` (seeded) in eval mode, its ONNX export for 1x3x16x16, 12 seeded samples and the example input."""
    torch.manual_seed(0)
    module = net().eval()
    source = ModelSource(kind="torch", spec=net.__name__, module=module, onnx_path=None,
                         default_input_shape=(1, 3, 16, 16), description=net.__name__)
    float_onnx = onnx.load(str(export_model(source, tmp_path / "net.onnx",
                                            config=ExportConfig(input_shape=(1, 3, 16, 16))).path))
    name = float_onnx.graph.input[0].name
    rng = np.random.default_rng(0)
    samples = [{name: rng.normal(size=(1, 3, 16, 16)).astype(np.float32)} for _ in range(12)]
    return module, float_onnx, samples, (torch.from_numpy(samples[0][name].copy()),)


def _carried_16x16(tmp_path: Path, net: type[torch.nn.Module], options, config: QuantConfig | None = None):
    """``net`` exported (``_exported_16x16``), quantized (``config``; by default int8 activations, min/max) and its
    plan carried with ``options``: the QDQ result, the carried plan, the samples and the example input."""
    module, float_onnx, samples, example = _exported_16x16(tmp_path, net)
    result = quantize(float_onnx, samples, config=config or QuantConfig(
        scheme=Scheme(activation_dtype="int8"), calibration=CalibrationSpec(method="minmax")))
    carried = carry_plan(module, example, float_model=float_onnx, qdq=result.model, plan=result.plan,
                         options=options)
    return result, carried, samples, example


def test_a_concatenation_reaches_litert_on_one_grid(tmp_path):
    """The plan gives each branch its own grid; LiteRT's converter refuses a concatenation whose inputs differ in
    scale, so the branches write the concatenation's grid, and the .tflite still computes what the QDQ model does."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert

    result, carried, samples, example = _carried_16x16(tmp_path, _Fire, litert.CARRY)
    assert carried.unmatched == ()
    path = tmp_path / "fire.tflite"
    path.write_bytes(litert.lower(carried.program, example).buffer)
    _assert_computes_the_qdq_model(result.model, litert.Runner(path), samples[:4], floor_db=25)


class _Residual(torch.nn.Module):
    """conv -> relu -> conv, added to its input: a residual Add of two quantized tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.body = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = x + self.body(x)
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class _Residuals(torch.nn.Module):
    """Two residual blocks, ResNet's way (``out += identity``, then relu): the second Add's second input, whose scale
    coremltools normalizes the Add by, is the first Add's output, whose grid it wrote in units of another scale."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.first = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.second = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = torch.relu(self.first(x) + x)
        x = torch.relu(self.second(x) + x)
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


@pytest.mark.parametrize("module", [_Residual, _Residuals])
def test_the_core_ml_package_holds_the_plans_grids(tmp_path, module):
    """Core ML (converts anywhere, runs on macOS only): every int8 weight's integers and scales and every activation
    grid of the ML Program are the plan's, the residual Adds' output grids included once coremltools' scale
    normalization of a quantized add (the same grid in units of one input's scale) is undone, through a chain of
    them (ResNet-18's four foreign grids before)."""
    pytest.importorskip("coremltools", reason="the coreml extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import coreml

    result, carried, _, example = _carried_16x16(tmp_path, module, coreml.CARRY)
    lowered = coreml.lower(carried.program, example)
    quantizes = [op for f in lowered.model._mil_program.functions.values() for op in f.operations
                 if op.op_type == "quantize"]
    assert any(coreml._normalized_by(op) != 1.0 for op in quantizes)  # the Add's output was rewritten
    planned_grids, planned_weights = qdq_grids(result.model)
    grids, weights = coreml.package_grids(lowered)
    assert len(weights) == len(planned_weights) == carried.weights
    assert all(same_weight(ints, scales, planned_weights) for ints, scales in weights)
    foreign = unplanned_grids(grids, planned_grids)
    assert len(foreign) <= len(carried.derived) and len(grids) >= 4, (foreign, planned_grids)
    for op in quantizes:  # each Add's output grid, read back in real units, is the plan's (not only counted)
        if coreml._normalized_by(op) != 1.0:
            zero = 0 if op.zero_point is None else int(np.asarray(op.zero_point.val).reshape(-1)[0])
            zero -= 128 if str(op.output_dtype.val) == "uint8" else 0
            real = (round(float(np.asarray(op.scale.val).reshape(-1)[0]) * coreml._normalized_by(op), 9), zero)
            assert unplanned_grids({real}, planned_grids) == [], (op.name, real, planned_grids)


class _Projection(torch.nn.Module):
    """A linear projection between two convs (MobileNetV2's bottleneck end): its output is quantized directly."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
        self.project = torch.nn.Conv2d(8, 8, 1)
        self.last = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.project(self.first(x)))


def test_litert_quantizing_a_float_layer_of_the_plan_is_found(tmp_path):
    """LiteRT's converter quantizes a float conv between quantized tensors itself (its own weight grid), so the
    plan's float projection does not stay float there: said, never passed as the plan (ExecuTorch keeps it float)."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert

    module, float_onnx, samples, example = _exported_16x16(tmp_path, _Projection)
    config = QuantConfig(scheme=Scheme(activation_dtype="int8"), calibration=CalibrationSpec(method="minmax"))
    plain = quantize(float_onnx, samples, config=config)
    convs = [n.name for n in plain.reference.graph.node if n.op_type == "Conv"]
    found = {}
    for name, result in (("none", plain),
                         ("projection", quantize(float_onnx, samples,
                                                 config=config.with_scheme(exclude=(convs[1],))))):
        carried = carry_plan(module, example, float_model=float_onnx, qdq=result.model, plan=result.plan,
                             options=litert.CARRY)
        assert carried.unmatched == ()
        found[name] = litert.unhonoured_floats(litert.lower(carried.program, example), result.model)
    assert found["none"] is None
    assert found["projection"] is not None and "quantized 1 of the 1 conv/linear layer(s)" in found["projection"]


class _GenericConv(torch.nn.Module):
    """A conv written as the generic aten.convolution (as torch's TorchScript converter writes it), which the
    runtimes' quantizers do not annotate, then a linear."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten.convolution(x, self.conv.weight, self.conv.bias, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return self.fc(torch.relu(y).mean(dim=(2, 3)))


def test_weights_the_plan_quantized_but_no_torch_op_took_are_named(tmp_path):
    module = _GenericConv().eval()
    source = ModelSource(kind="torch", spec="generic", module=module, onnx_path=None,
                         default_input_shape=(1, 3, 16, 16), description="generic conv")
    path = export_model(source, tmp_path / "g.onnx", config=ExportConfig(input_shape=(1, 3, 16, 16))).path
    float_onnx = onnx.load(str(path))
    rng = np.random.default_rng(0)
    name = float_onnx.graph.input[0].name
    samples = [{name: rng.normal(size=(1, 3, 16, 16)).astype(np.float32)} for _ in range(8)]
    result = quantize(float_onnx, samples, config=QuantConfig(scheme=Scheme(activation_dtype="int8")))
    example = (torch.from_numpy(samples[0][name].copy()),)
    carried = carry_plan(module, example, float_model=float_onnx, qdq=result.model, plan=result.plan)
    assert carried.weights == 1  # the linear's
    assert [u for u in carried.unmatched if "(its Conv weights)" in u], carried.unmatched


class _ScaledBoxes(torch.nn.Module):
    """A detector head's decode: sigmoid box offsets times the input size (a Python scalar: a constant tensor only
    the torch program holds as one), beside sigmoid scores, concatenated as YOLOv8's (N, 4 + C, A)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
        self.boxes = torch.nn.Conv2d(8, 4, 1)
        self.scores = torch.nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.body(x)
        boxes = torch.sigmoid(self.boxes(f)).flatten(2) * 16
        return torch.cat([boxes, torch.sigmoid(self.scores(f)).flatten(2)], 1)


def test_a_constant_only_the_torch_program_holds_gets_the_grid_of_its_value(tmp_path):
    """``box * 16``: the plan's ONNX model holds 16 as an initializer, the torch program as a constant tensor no
    activation matches; it is carried on the grid ORT's quantizer gives such a constant (16 exactly on it), named
    among the derived grids, and the .pte computes what the QDQ model does (it was refused as unmatched before)."""
    pytest.importorskip("executorch", reason="the executorch extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import executorch as et

    result, carried, samples, example = _carried_16x16(tmp_path, _ScaledBoxes, et.CARRY)
    assert carried.unmatched == () and any(name.startswith("_tensor_constant") for name in carried.derived)
    path = tmp_path / "boxes.pte"
    et.lower(carried.program, example).write(path)
    _assert_computes_the_qdq_model(result.model, et.Runner(path), samples[:4], floor_db=25)


class _ScaledConvs(torch.nn.Module):
    """Constant scales and shifts after convs, as DBNet's and learnable-affine heads write them: ORT's pre-processing
    folds a per-channel (or scalar) Mul after a Conv into it, so the plan has no grid on the conv's own output."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = torch.nn.Conv2d(8, 8, 1)
        self.c4 = torch.nn.Conv2d(8, 4, 1)
        self.register_buffer("gain", torch.linspace(0.5, 2.0, 8).reshape(1, 8, 1, 1))
        self.register_buffer("shift", torch.linspace(-0.3, 0.3, 8).reshape(8, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y) * 0.25 + 1.0)
        y = torch.relu(self.c3(y) * self.gain + self.shift)
        return self.c4(y)


def _carried_unfolded(tmp_path: Path, net: type[torch.nn.Module], options):
    """``_carried_16x16`` with compile's recipe: npukit's own folding of affines off, so that ORT's pre-processing
    is the only folding."""
    module, float_onnx, samples, example = _exported_16x16(tmp_path, net)
    result = quantize(float_onnx, samples, config=QuantConfig(scheme=Scheme(activation_dtype="int8"),
                                                              calibration=CalibrationSpec(method="minmax"),
                                                              recipe=Recipe(fold_affines=False)))
    carried = carry_plan(module, example, float_model=float_onnx, qdq=result.model, plan=result.plan,
                         options=options)
    return result, carried, samples, example


def test_scales_ort_folded_into_convs_are_folded_in_the_program_too(tmp_path):
    """``conv * 0.25 + 1`` and ``conv * gain + shift``: the Mul, and the Mul and the Add, ORT folded into the convs
    are folded into the torch convs as well (the plan's grids all carried, nothing unmatched; before, the compile was
    refused) and the .pte computes what the QDQ model does; the scalar Add ORT left alone stays an op of its own."""
    from npukit.runtime import executorch as et

    result, carried, samples, example = _carried_unfolded(tmp_path, _ScaledConvs, et.CARRY)
    assert carried.unmatched == () and len(carried.folded) == 3, carried.folded
    ops = [str(n.target) for n in carried.program.graph.nodes if n.op == "call_function"]
    assert sum("aten.mul" in op for op in ops) == 0 and sum("aten.add" in op for op in ops) == 1
    path = tmp_path / "scaled.pte"
    et.lower(carried.program, example).write(path)
    _assert_computes_the_qdq_model(result.model, et.Runner(path), samples[:4], floor_db=25)


class _FrozenNorms(torch.nn.Module):
    """Convs with torchvision's FrozenBatchNorm2d (detection backbones): its scale and shift are computed from
    buffers in forward, ops of the torch program the ONNX exporter folds into constants."""

    def __init__(self) -> None:
        from torchvision.ops.misc import FrozenBatchNorm2d

        super().__init__()
        self.c1, self.n1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), FrozenBatchNorm2d(8)
        self.c2, self.n2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), FrozenBatchNorm2d(8)
        self.head = torch.nn.Conv2d(8, 4, 1)
        for norm in (self.n1, self.n2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.2, 0.2)
            norm.running_mean.uniform_(-0.3, 0.3)
            norm.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.n1(self.c1(x)))
        return self.head(torch.relu(self.n2(self.c2(y))))


def test_a_frozen_batchnorm_is_folded_as_the_onnx_model_has_it(tmp_path):
    """FrozenBatchNorm2d: the program's buffer computations folded to constants, then its scale and shift into the
    conv, as the ONNX side has them (32 tensors were unmatched and the compile refused); the .pte computes what the
    QDQ model does."""
    from npukit.runtime import executorch as et

    result, carried, samples, example = _carried_unfolded(tmp_path, _FrozenNorms, et.CARRY)
    assert carried.unmatched == () and len(carried.folded) == 4, carried.folded
    path = tmp_path / "frozen.pte"
    et.lower(carried.program, example).write(path)
    _assert_computes_the_qdq_model(result.model, et.Runner(path), samples[:4], floor_db=25)


def test_an_affine_ort_kept_is_not_folded(tmp_path):
    """A scale on a conv whose output another op reads too: ORT keeps the Mul (the conv's output is a tensor of the
    plan), and so does the program."""
    from npukit.quant.emit.torch_affines import fold_matched_affines

    class _Shared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)
            return torch.cat([y * 0.5, torch.relu(y)], 1)

    program = torch.export.export(_Shared().eval(), (torch.zeros(1, 3, 8, 8),)).module()
    conv = next(n for n in program.graph.nodes if "conv2d" in str(n.target))
    folded, _ = fold_matched_affines(program, lambda m: {n: n.name for n in m.graph.nodes if n is not conv},
                                     lambda name: True)
    assert folded == [] and any("aten.mul" in str(n.target) for n in program.graph.nodes)


class _UpConv(torch.nn.Module):
    """A U-Net decoder step: a transposed conv upsampling, concatenated with the skip."""

    def __init__(self) -> None:
        super().__init__()
        self.down = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU())
        self.up = torch.nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.skip = torch.nn.Conv2d(3, 8, 1)
        self.head = torch.nn.Conv2d(16, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.up(self.down(x)), self.skip(x)], 1))


def test_a_transposed_conv_takes_the_plans_weights_on_litert(tmp_path):
    """LiteRT: the transposed conv's weights carried per channel on axis 1, nothing unmatched, and the .tflite
    computes what the QDQ model does (it was refused)."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert

    result, carried, samples, example = _carried_16x16(tmp_path, _UpConv, litert.CARRY)
    assert carried.unmatched == () and carried.weights == 4
    path = tmp_path / "up.tflite"
    path.write_bytes(litert.lower(carried.program, example).buffer)
    _assert_computes_the_qdq_model(result.model, litert.Runner(path), samples[:4], floor_db=25)


class _Decoder(torch.nn.Module):
    """conv -> relu -> transposed conv (stride 2, 8 -> 4 channels: its weight's axes 0 and 1 differ) -> relu ->
    conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.up = torch.nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.head = torch.nn.Conv2d(4, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.up(torch.relu(self.conv(x)))))


@pytest.mark.parametrize("net", [_UpConv, _Decoder])
def test_a_transposed_conv_takes_the_plans_weights_on_executorch(net, tmp_path):
    """ExecuTorch: the transposed conv's weights carried per channel on axis 1 (C_out), nothing unmatched, and the
    .pte loads (a 'Failed to load method forward' was reported and the plan refused; it does not reproduce on
    executorch 1.5.1) and computes what the QDQ model does: to one step of the output's grid without a
    concatenation, near it with one (its single grid, as for the LiteRT test above)."""
    from npukit.runtime import executorch as et

    result, carried, samples, example = _carried_16x16(tmp_path, net, et.CARRY)
    assert carried.unmatched == () and carried.weights == (4 if net is _UpConv else 3)
    up = next(n for n in carried.program.graph.nodes if "conv_transpose" in str(n.target))
    weight, scales, _, axis = (operator.attrgetter(a.target)(carried.program) if isinstance(a, torch.fx.Node)
                               else a for a in up.args[1].args[:4])
    assert axis == 1 and scales.shape == (weight.shape[1],)
    lowered = et.lower(carried.program, example)
    assert lowered.portable_ops == {} and lowered.delegate_calls == 1
    path = tmp_path / "up.pte"
    lowered.write(path)
    runner = et.Runner(path)
    if net is _UpConv:
        _assert_computes_the_qdq_model(result.model, runner, samples[:4], floor_db=25)
        return
    step = float([n for n in carried.program.graph.nodes if "quantize_per_tensor" in str(n.target)][-1].args[1])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(result.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for feeds in samples[:4]:
        assert np.abs(session.run(None, feeds)[0] - runner(feeds)[0]).max() <= step * 1.001


class _PReLUPool(torch.nn.Module):
    """conv -> PReLU -> global mean -> linear: ORT's plan leaves PReLU's output unquantized."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.act, self.fc = torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.PReLU(), torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(self.conv(x)).mean((2, 3)))


def test_an_average_of_a_tensor_the_plan_leaves_in_float_shares_its_range_grid_on_litert(tmp_path):
    """LiteRT's mean keeps its input's grid; the input (PReLU's output) has none in the plan, so the mean had none
    and the compile was refused ('mean (read by linear)'): both are on the grid of the input's calibrated range,
    and the .tflite computes what the QDQ model does."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert

    result, carried, samples, example = _carried_16x16(tmp_path, _PReLUPool, litert.CARRY)
    assert carried.unmatched == (), carried.unmatched
    path = tmp_path / "prelu.tflite"
    path.write_bytes(litert.lower(carried.program, example).buffer)
    _assert_computes_the_qdq_model(result.model, litert.Runner(path), samples[:4], floor_db=25)


class _LayerNorm2d(torch.nn.LayerNorm):
    """ConvNeXt's LayerNorm2d: a LayerNorm over the channels, computed in NHWC between two permutes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias,
                                           self.eps)
        return x.permute(0, 3, 1, 2)


class _ConvNeXtStage(torch.nn.Module):
    """torchvision's CNBlock between a LayerNorm2d stem and a downsample: depthwise conv, then in NHWC LayerNorm,
    Linear, GELU, Linear, then back in NCHW a layer scale [C, 1, 1] and the residual Add. ORT's pre-processing (its
    transpose optimizer) computes that Mul and Add in NHWC: no ONNX tensor has their torch shape."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, channels, 4, 4), _LayerNorm2d(channels))
        self.dw = torch.nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = torch.nn.LayerNorm(channels)
        self.expand = torch.nn.Linear(channels, 4 * channels)
        self.project = torch.nn.Linear(4 * channels, channels)
        self.layer_scale = torch.nn.Parameter(torch.linspace(0.2, 0.8, channels).reshape(channels, 1, 1))
        self.down = torch.nn.Sequential(_LayerNorm2d(channels), torch.nn.Conv2d(channels, 2 * channels, 2, 2))
        self.head = torch.nn.Linear(2 * channels, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.project(torch.nn.functional.gelu(self.expand(self.norm(y)))).permute(0, 3, 1, 2)
        x = x + self.layer_scale * y
        return self.head(self.down(x).mean((2, 3)))


@pytest.mark.parametrize("runtime", ["executorch", "litert"])
def test_a_convnext_block_is_carried_where_ort_moved_its_ops_to_nhwc(tmp_path, runtime):
    """The layer scale's Mul and the residual Add are NCHW in the torch program and NHWC in the planned ONNX model:
    matched up to a permutation of their axes (the values prove it), they take the plan's grids (before, the compile
    was refused on both runtimes: 'permute_3 (read by mul), mul, mul (read by add), add' unmatched), and the artifact
    computes what the QDQ model does."""
    if runtime == "litert":
        pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import executorch as et
    from npukit.runtime import litert

    target = {"executorch": et, "litert": litert}[runtime]
    result, carried, samples, example = _carried_unfolded(tmp_path, _ConvNeXtStage, target.CARRY)
    assert carried.unmatched == (), carried.unmatched
    assert any(line.startswith("add = ") for line in carried.permuted), carried.permuted
    assert carried.weights == 6  # the stem, the depthwise conv, both linears, the downsample and the head
    path = tmp_path / ("stage.pte" if runtime == "executorch" else "stage.tflite")
    if runtime == "executorch":
        et.lower(carried.program, example).write(path)
    else:
        path.write_bytes(litert.lower(carried.program, example).buffer)
    _assert_computes_the_qdq_model(result.model, target.Runner(path), samples[:4], floor_db=25)


class _FloatStemPool(torch.nn.Module):
    """A U-Net's first level: conv -> relu, then max pool -> conv -> relu -> upsampled, concatenated with the relu
    (the skip) -> conv. With the first conv kept in float, the pool reads the float Relu's edge, which the
    concatenation gives a grid."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = torch.relu(self.stem(x))
        y = torch.relu(self.conv(torch.nn.functional.max_pool2d(skip, 2)))
        y = torch.nn.functional.interpolate(y, scale_factor=2.0, mode="nearest")
        return self.head(torch.cat([y, skip], 1))


def test_a_max_pool_after_a_float_stem_keeps_its_input_grid_on_executorch(tmp_path):
    """A U-Net whose plan kept its first block in float (compile's scored float head): its max pool's output took
    the plan's own grid of its tensor, not its input edge's, and XNNPACK refused the .pte at load ('Failed to
    create maxpool2d node: xnn_status_invalid_parameter'; compile crashed with an internal error). A pool, which
    passes values on, keeps its input's grid; the .pte loads and computes what the QDQ model does."""
    from npukit.runtime import executorch as et

    module, float_onnx, samples, example = _exported_16x16(tmp_path, _FloatStemPool)
    stem = next(n.name for n in float_onnx.graph.node if n.op_type == "Conv")
    # percentile ranges: the pool's output (a quarter of its input's values) clipped elsewhere than its input
    config = QuantConfig(scheme=Scheme(activation_dtype="int8", exclude=(stem,)),
                         calibration=CalibrationSpec(method="percentile"))
    result = quantize(float_onnx, samples, config=config)
    carried = carry_plan(module, example, float_model=float_onnx, qdq=result.model, plan=result.plan,
                         options=et.CARRY)
    assert carried.unmatched == () and carried.float_nodes
    pool = next(n for n in carried.program.graph.nodes if "max_pool2d" in str(n.target))
    (after,) = pool.users
    assert pool.args[0].args[1:3] == after.args[1:3]  # the pool's input and output grids: one scale, one zero
    path = tmp_path / "pool.pte"
    et.lower(carried.program, example).write(path)
    _assert_computes_the_qdq_model(result.model, et.Runner(path), samples[:4], floor_db=25)


class _SharedConv(torch.nn.Module):
    """One conv called twice (``c(a + big) - c(big)``): both calls read one weight node of the torch program."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.b = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.c = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = 4 * torch.sigmoid(self.b(x))
        return self.c(self.a(x) + big) - self.c(big)


def test_a_conv_called_twice_takes_the_plans_weights_in_both_calls_on_executorch(tmp_path):
    """XNNPACK's quantizer skipped the second call (its weight node annotated already): float weights on an int8
    input, which XNNPACK refused at load ('Failed to create depthwise convolution node'). Each call reads its own
    weight node: both are annotated, the .pte loads and computes what the QDQ model does."""
    from npukit.runtime import executorch as et

    result, carried, samples, example = _carried_16x16(tmp_path, _SharedConv, et.CARRY)
    assert carried.unmatched == ()
    convs = [n for n in carried.program.graph.nodes if "conv2d" in str(n.target)]
    assert len(convs) == 4 and all("dequantize_per_channel" in str(c.args[1].target) for c in convs)
    path = tmp_path / "shared.pte"
    et.lower(carried.program, example).write(path)
    _assert_computes_the_qdq_model(result.model, et.Runner(path), samples[:4], floor_db=25)


class _PooledStem(torch.nn.Module):
    """A ResNet stem: conv -> ReLU -> 3x3 max pool padded by 1 (``relu=False``: the pool reads the conv)."""

    def __init__(self, relu: bool = True) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = self.pool(torch.relu(y) if self.relu else y)
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(y)), 1), 1))


class _OpenStem(_PooledStem):
    def __init__(self) -> None:
        super().__init__(relu=False)


@pytest.mark.parametrize("net", [_PooledStem, _OpenStem])
def test_a_max_pool_of_a_relu_is_padded_with_zeros_on_litert(tmp_path, net):
    """A max pool padded by 1 after a ReLU becomes a PAD (zeros; int8: on its input's grid, whose zero is its lowest
    value) and an unpadded MAX_POOL_2D, which XNNPACK takes (the converter's PADV2 of -inf or -128 split the delegate
    in two), fp32 and INT8, and the .tflite computes what eager torch and the QDQ model compute. A pool whose input
    can be negative keeps its PADV2 (zeros there would change the maxima at the borders)."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert

    module, _, samples, example = _exported_16x16(tmp_path, net)
    fp32 = litert.lower(module, example)
    result, carried, _, _ = _carried_16x16(tmp_path, net, litert.CARRY)
    int8 = litert.lower(carried.program, example)
    for lowered in (fp32, int8):
        if net is _PooledStem:
            assert "PADV2" not in lowered.ops and lowered.ops["PAD"] == 1 and lowered.delegation.left == {}
            assert lowered.delegation.partitions == 1
        else:
            assert lowered.ops["PADV2"] == 1 and "PAD" not in lowered.ops
    fp32.write(tmp_path / "fp32.tflite")
    int8.write(tmp_path / "int8.tflite")
    want = module(*example).detach().numpy()
    got = litert.Runner(tmp_path / "fp32.tflite")({"x": example[0].numpy()})[0]
    assert np.abs(want - got).max() <= 1e-4 * np.ptp(want), np.abs(want - got).max()
    _assert_computes_the_qdq_model(result.model, litert.Runner(tmp_path / "int8.tflite"), samples[:4], floor_db=25)


class _TinyLayerScale(_ConvNeXtStage):
    """A ConvNeXt stage with an untrained layer scale (1e-6, torchvision's initial value): the residual Add's branch
    grid is about 1e-6 of its output's."""

    def __init__(self) -> None:
        super().__init__()
        with torch.no_grad():
            self.layer_scale.fill_(1e-6)


def test_int8_ops_xnnpack_refuses_run_in_float_inside_the_litert_delegate(tmp_path, monkeypatch):
    """The converter's int8 GELU (XNNPACK takes GELU in float only) and an int8 ADD whose input grid is under 1/1024
    of its output's (XNNPACK's limit) each ran in LiteRT's kernel between delegate partitions; written as DEQUANTIZE
    -> float op -> QUANTIZE the model is one partition and computes what it computed (the same grids; float
    arithmetic in between) and what the QDQ model does."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert, litert_float_ops

    result, carried, samples, example = _carried_unfolded(tmp_path, _TinyLayerScale, litert.CARRY)
    monkeypatch.setattr(litert, "float_islands", lambda buffer: (buffer, 0))
    as_converted = litert.lower(carried.program, example)
    monkeypatch.undo()
    assert as_converted.delegation.left == {"GELU": 1, "ADD": 1}, as_converted.delegation.left
    buffer, rewritten = litert_float_ops.float_islands(as_converted.buffer)
    assert rewritten == 2
    (tmp_path / "before.tflite").write_bytes(as_converted.buffer)
    (tmp_path / "after.tflite").write_bytes(buffer)
    after = litert.Runner(tmp_path / "after.tflite")
    taken = litert.delegation(after.interpreter)
    assert taken.partitions == 1 and taken.left == {} and taken.delegated > as_converted.delegation.delegated
    before = litert.Runner(tmp_path / "before.tflite")
    for feeds in samples[:4]:
        want, got = before(feeds)[0], after(feeds)[0]
        assert 10 * np.log10(np.sum(want ** 2) / max(np.sum((want - got) ** 2), 1e-30)) > 40
    _assert_computes_the_qdq_model(result.model, after, samples[:4], floor_db=25)


class _Reduction(torch.nn.Module):
    """Inception-ResNet's reduction block as a model's output: two conv branches and a max pool of the block's
    input, which the branches read too, concatenated (the plan leaves the graph output float)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.left = torch.nn.Conv2d(8, 8, 3, stride=2)
        self.right = torch.nn.Sequential(torch.nn.Conv2d(8, 4, 1), torch.nn.ReLU(), torch.nn.Conv2d(4, 8, 3, 2))
        self.pool = torch.nn.MaxPool2d(3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        return torch.cat([torch.relu(self.left(x)), torch.relu(self.right(x)), self.pool(x)], 1)


def test_a_concatenation_of_a_max_pool_of_a_shared_input_reaches_litert_on_one_grid(tmp_path):
    """The max pool's output is on its input's grid, which the conv branches read too: LiteRT's converter refused
    the concatenation ('quantization parameters violate the same scale constraint', facenet-pytorch's
    InceptionResnetV1). The pool's input writes the concatenation's grid, widened to cover its own, and the .tflite
    computes what the QDQ model does."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert

    result, carried, samples, example = _carried_16x16(tmp_path, _Reduction, litert.CARRY)
    assert carried.unmatched == ()
    lowered = litert.lower(carried.program, example)
    assert lowered.ops["CONCATENATION"] == 1 and lowered.delegation.left == {}
    lowered.write(tmp_path / "reduction.tflite")
    _assert_computes_the_qdq_model(result.model, litert.Runner(tmp_path / "reduction.tflite"), samples[:4],
                                   floor_db=25)


class _AveragePooled(torch.nn.Module):
    """Inception's 3x3 average pool (stride 1, padding 1) between convs, a softmax at the output."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv = torch.nn.Conv2d(8, 8, 1)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = torch.relu(self.conv(torch.nn.functional.avg_pool2d(x, 3, 1, 1)))
        return torch.softmax(self.head(x.mean((2, 3))), 1)


def test_an_int8_average_pool_runs_in_float_inside_the_litert_delegate(tmp_path, monkeypatch):
    """XNNPACK's delegate takes AVERAGE_POOL_2D in float only: the converter's int8 pool (6 in Inception v3) ran in
    LiteRT's kernel between partitions; rewritten in float on its grids, the model is one partition and computes
    what the QDQ model does."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert

    result, carried, samples, example = _carried_16x16(tmp_path, _AveragePooled, litert.CARRY)
    monkeypatch.setattr(litert, "float_islands", lambda buffer: (buffer, 0))
    assert litert.lower(carried.program, example).delegation.left == {"AVERAGE_POOL_2D": 1}
    monkeypatch.undo()
    lowered = litert.lower(carried.program, example)
    assert lowered.delegation.left == {} and lowered.delegation.partitions == 1
    lowered.write(tmp_path / "pooled.tflite")
    _assert_computes_the_qdq_model(result.model, litert.Runner(tmp_path / "pooled.tflite"), samples[:4],
                                   floor_db=25)


class _C2f(torch.nn.Module):
    """YOLOv8's C2f block: a conv's output split in two, both pieces concatenated with a conv of the second."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.inner = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.out = torch.nn.Conv2d(12, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = torch.relu(self.stem(x)).split([4, 4], 1)
        return self.out(torch.cat([a, b, torch.relu(self.inner(b))], 1))


class _Focus(torch.nn.Module):
    """YOLOX's and YOLOv5's stem: four strided slices of the image concatenated (ORT's optimizer writes them as
    SpaceToDepth and Gather: the ONNX model has no tensor for the slices)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(12, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)
        return torch.relu(self.conv(x))


@pytest.mark.parametrize("net", [_C2f, _Focus])
def test_split_and_sliced_pieces_reach_litert_on_their_inputs_grid(tmp_path, net):
    """A split's pieces and a slice carry their input's values, on its grid: concatenated, their producer writes the
    concatenation's grid (LiteRT's converter refused YOLOv8's C2f: 'the same scale constraint'), and the slices ORT
    rewrote as SpaceToDepth take their input's grid (YOLOX's Focus was refused: no tensor of the plan for them)."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert

    result, carried, samples, example = _carried_16x16(tmp_path, net, litert.CARRY)
    # (the QDQ model keeps ORT's SpaceToDepth and Gather, the Focus concatenation, in float: so does the program)
    assert carried.unmatched == () and not [n for n in carried.unplanned if n != "cat"], carried.unplanned
    lowered = litert.lower(carried.program, example)
    # (strided slices stay on LiteRT's own kernels, fp32 too: its XNNPACK delegate takes strides of 1 only)
    assert lowered.ops["CONCATENATION"] == 1 and set(lowered.delegation.left) <= {"STRIDED_SLICE"}
    lowered.write(tmp_path / "net.tflite")
    _assert_computes_the_qdq_model(result.model, litert.Runner(tmp_path / "net.tflite"), samples[:4], floor_db=25)


class _WrittenNorm(torch.nn.Module):
    """A layer norm over channels written out op by op, as Paddle exports one (PP-OCRv4's recognizer): ORT's
    optimizer fuses it into one LayerNormalization, which the plan quantizes on its input and output only."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.bias = torch.nn.Parameter(torch.linspace(-0.2, 0.2, 8))
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).permute(0, 2, 3, 1)
        mean = x.mean(-1, keepdim=True)
        centred = x - mean
        x = centred / torch.sqrt((centred ** 2).mean(-1, keepdim=True) + 1e-5) * self.weight + self.bias
        return self.head(x.permute(0, 3, 1, 2))


@pytest.mark.parametrize("runtime", ["executorch", "litert"])
def test_ops_the_plan_has_no_tensor_for_run_in_float(tmp_path, runtime):
    """ORT fused the written-out layer norm: its means, subtraction, square root and division have no tensor in the
    plan. They run in float between the plan's grids, as the QDQ model computes them (the compile was refused:
    'cannot yet carry its INT8 plan'), named in the carried plan; the artifact computes what the QDQ model does."""
    if runtime == "litert":
        pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import executorch, litert

    module = {"executorch": executorch, "litert": litert}[runtime]
    result, carried, samples, example = _carried_16x16(tmp_path, _WrittenNorm, module.CARRY)
    # XNNPACK's quantizer annotates the norm's subtraction, scaling and shift (its means, square root and division
    # it leaves float anyway): before, those were refused
    assert carried.unmatched == ()
    assert carried.unplanned and all(n.split("_")[0] in ("add", "sub", "mul") for n in carried.unplanned), \
        carried.unplanned
    path = tmp_path / f"norm{'.pte' if runtime == 'executorch' else '.tflite'}"
    module.lower(carried.program, example).write(path)
    _assert_computes_the_qdq_model(result.model, module.Runner(path), samples[:4], floor_db=20)


class _BoxesAndScores(torch.nn.Module):
    """A detector's output: boxes in pixels (up to a few hundred) concatenated with class scores in [0, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.boxes = torch.nn.Conv2d(8, 4, 1)
        self.scores = torch.nn.Conv2d(8, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        boxes = torch.relu(self.boxes(x)) * 160.0
        return torch.cat([boxes, torch.sigmoid(self.scores(x))], 1).flatten(2)


def test_a_float_concatenation_stays_float_on_litert(tmp_path):
    """The plan leaves a concatenation of boxes up to hundreds of pixels and scores in [0, 1] float (its joins rule);
    LiteRT's converter put it, and the scores with it, on the grid of its one dequantized input, the boxes' (NudeNet's
    YOLOv8: every score 0 or 1.25, mAP@0.5 0.16 at 30 dB of output SQNR). The box scaling that writes that input
    writes float, and the scores keep their precision."""
    pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import litert

    from npukit.verbs.compile_mobile import XNNPACK_INT8

    result, carried, samples, example = _carried_16x16(tmp_path, _BoxesAndScores, litert.CARRY, XNNPACK_INT8)
    assert "node_cat" in result.plan.float_nodes  # the plan's joins rule
    assert carried.unmatched == () and "cat" in carried.float_nodes and carried.float_concat_inputs == ("mul",)
    litert.lower(carried.program, example).write(tmp_path / "det.tflite")
    runner = litert.Runner(tmp_path / "det.tflite")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(result.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for feeds in samples[:4]:
        want, got = session.run(None, feeds)[0][:, 4:], runner(feeds)[0][:, 4:]  # the scores
        assert np.abs(want - got).max() < 0.02, np.abs(want - got).max()


class _DeadChannel(torch.nn.Module):
    """A conv with an output channel whose weights are 1e-35 (as CLE left one of PP-OCRv4's detector's)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            self.stem.weight[3] = 1e-35

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.stem(x)))


def test_a_dead_channels_weight_scale_does_not_keep_the_pte_from_loading(tmp_path):
    """ORT gave PP-OCRv4's dead channel a weight scale of 7.5e-37; its bias's scale (the input's times it) is
    subnormal, and XNNPACK refused it at load ('Failed to define tensor', the .pte did not load). The channel takes
    the median scale of the others: its weights round to 0 either way, and the .pte computes what the QDQ model
    does."""
    from onnx import numpy_helper

    from npukit.quant.emit.pt2e import _live_scales
    from npukit.runtime import executorch

    assert list(_live_scales(np.array([1e-3, 7.5e-37, 3e-3, 0.0]))) == [1e-3, 2e-3, 3e-3, 2e-3]
    module, float_onnx, samples, example = _exported_16x16(tmp_path, _DeadChannel)
    result = quantize(float_onnx, samples, config=QuantConfig(scheme=Scheme(activation_dtype="int8"),
                                                              calibration=CalibrationSpec(method="minmax")))
    for init in result.model.graph.initializer:  # the plan's scale of the dead channel, as ORT gave PP-OCRv4's
        if init.name == "stem.weight_scale":  # (times the input's, about 0.03: below float32's smallest normal)
            scales = numpy_helper.to_array(init).copy()
            scales[3] = 1e-37
            init.CopyFrom(numpy_helper.from_array(scales, init.name))
    carried = carry_plan(module, example, float_model=float_onnx, qdq=result.model, plan=result.plan,
                         options=executorch.CARRY)
    assert carried.unmatched == ()
    executorch.lower(carried.program, example).write(tmp_path / "dead.pte")
    _assert_computes_the_qdq_model(result.model, executorch.Runner(tmp_path / "dead.pte"), samples[:4], floor_db=25)


class _Levels(torch.nn.Module):
    """YOLOv8's head: per level, its box and score convs concatenated and flattened; then the levels concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.down = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.boxes = torch.nn.ModuleList(torch.nn.Conv2d(8, 4, 1) for _ in range(2))
        self.scores = torch.nn.ModuleList(torch.nn.Conv2d(8, 3, 1) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = torch.relu(self.stem(x))
        levels = [first, torch.relu(self.down(first))]
        heads = [torch.cat([b(f), s(f)], 1).flatten(2) for f, b, s in zip(levels, self.boxes, self.scores)]
        return torch.relu(torch.cat(heads, 2))


def test_a_concatenation_of_concatenations_loads_on_executorch(tmp_path):
    """A concatenation of concatenations loads and computes what the QDQ model does. Where the outer one makes an
    inner one write its grid, the inner one's inputs go onto that grid too (requantized on their edges): XNNPACK
    refused a concatenation whose inputs and output differ ('Failed to create cat2 node': NudeNet's YOLOv8 .pte did
    not load; this small head gets one grid from the plan for both levels and shows the structure, not that
    failure)."""
    from npukit.runtime import executorch

    from npukit.verbs.compile_mobile import XNNPACK_INT8

    result, carried, samples, example = _carried_16x16(tmp_path, _Levels, executorch.CARRY, XNNPACK_INT8)
    assert carried.unmatched == ()
    executorch.lower(carried.program, example).write(tmp_path / "levels.pte")
    _assert_computes_the_qdq_model(result.model, executorch.Runner(tmp_path / "levels.pte"), samples[:4], floor_db=25)
