"""Emit a quantization plan into a torch program (PT2E): the grids npukit chose and emitted on the ONNX model carried
onto the ``torch.export`` graph of the same model as fixed quantization parameters, and the weights the plan rounded
(AdaRound, GPTQ-style corrections, bias correction) carried with them, so that ``convert_pt2e`` and a runtime's
lowering (ExecuTorch's XNNPACK delegate) compute on exactly the plan's integers.

Which torch tensor is which ONNX tensor: both graphs come from the same module, so each tensor of the torch program
is matched to the ONNX tensor with the same shape and the same values on one real input (to 1e-4 of its range),
the earliest such tensor in the ONNX graph's order not yet taken (a Conv's output before the Clip after it, which
equals it wherever nothing is clipped). A match of values is a proof of identity that names cannot give: the two
exporters name tensors differently, and BatchNorm is folded on both sides. A torch tensor no ONNX tensor equals is
matched to one equal to it up to a permutation of its axes (``layouts``): ORT's transpose optimizer computes some
elementwise ops in the other layout (a ConvNeXt block's layer scale and residual Add in NHWC); named in
``CarriedPlan.permuted``.

Which edges are quantized and how they pair with ops (conv + relu fused, shared grids through pooling and
reshapes) is the XNNPACK quantizer's annotation, which its partitioner lowers; only the grids are replaced: each
annotated activation gets the QDQ model's grid of its tensor (int8: an asymmetric uint8 grid shifted by 128, the
same real values), a tensor the ONNX model leaves unquantized before a Relu / Clip gets the grid after it (the
same function: the clamp is the grid's own range), a node the plan keeps in float is left unannotated, and each
weight gets the plan's per-channel scales with its dequantized integer weights, so quantizing it again on those
scales gives back the plan's integers. What cannot be matched is named in ``CarriedPlan.unmatched``; the caller
refuses such a program.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from npukit.quant.emit.layouts import PermutedIndex
from npukit.quant.emit.torch_affines import fold_buffer_computations, fold_matched_affines
from npukit.quant.grids import activation_qparams
from npukit.quant.nodes import dequantized, node_attr
from npukit.quant.plan import QuantPlan

MATCH_TOLERANCE = 1e-4  # relative to the tensor's largest magnitude
DEAD_SCALE = 1e-24  # a weight scale below it is a dead channel's (``_live_scales``)
_CLAMPS = ("relu.default", "relu_.default", "hardtanh.default", "hardtanh_.default")
# ops XNNPACK quantizes with the input's grid shared, which compute a new value and so take a grid of their own
_REQUANTIZING = ("adaptive_avg_pool2d.default", "mean.dim", "mean.default", "avg_pool2d.default")
# ops that pass their input's values through unchanged (an exported eval-mode dropout is one)
_VIEWS = ("view.default", "flatten.using_ints", "reshape.default", "squeeze.dim", "squeeze.dims", "squeeze.default",
          "unsqueeze.default", "_unsafe_view.default", "dropout.default", "clone.default", "alias.default")
_CONCATS = ("cat.default", "concat.default")
# ops that pass some of their input's values through unchanged (a resize to the nearest pixel, a max pool, a slice,
# the pieces of a split: YOLOv8's C2f blocks concatenate both pieces of a split with the conv after one)
_PASSING = ("upsample_nearest2d.vec", "upsample_nearest2d.default", "max_pool2d.default", "permute.default",
            "transpose.int", "slice.Tensor", "split_with_sizes.default", "split.Tensor", "getitem")
_WEIGHTED = {"conv2d.default": ("Conv",), "conv1d.default": ("Conv",), "linear.default": ("Gemm", "MatMul")}
_TRANSPOSED = {"conv_transpose2d.input": ("ConvTranspose",)}  # with CarryOptions.transposed_convs
# the weight's output-channel axis, where it is not 0: a transposed conv's weight is [C_in, C_out / groups, kH, kW]
# (ORT quantizes it per channel on axis 1, XNNPACK's quantizer annotates it so)
_WEIGHT_AXIS = {"conv_transpose2d.input": 1}
_ONNX_VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")  # what ORT puts around a fused Gemm


@dataclasses.dataclass(frozen=True)
class CarryOptions:
    """How a runtime's converter wants the plan carried.

    ``fold_quantize``: as in ``convert_pt2e`` (LiteRT's converter wants the weights' quantize ops kept).
    ``average_grids``: an average (pooling, mean) gets its own grid from the plan (ExecuTorch), or it and its views
    share its input's (LiteRT: its MEAN keeps its input's scale, and a requantization after it leaves the next
    layer's bias on a scale its input does not have).
    ``same_scale_concat``: a concatenation's inputs and output all on the plan's grid of its output, the producers
    of its inputs writing that grid (LiteRT's CONCATENATION requires one scale; a requantization on an input edge
    is refused by its converter; XNNPACK's concatenation too: its own sharing puts every input on one input's
    grid, clipping the others).
    ``requantize_edges``: an input of a concatenation whose producer also feeds other ops is requantized onto the
    concatenation's grid on its edge (ExecuTorch); or, where the converter refuses that (LiteRT), that producer
    writes the concatenation's grid, widened to cover the producer's range, for all its readers.
    ``transposed_convs``: a transposed conv takes the plan's weights (per channel on axis 1) and grids (LiteRT's
    TRANSPOSE_CONV and ExecuTorch 1.5.1's XNNPACK deconvolution: checked, the program loads and computes what the
    QDQ model does); without it the plan's weights are not carried onto one, and the caller refuses the program.
    ``float_concat_inputs``: the elementwise ops that write a float concatenation's inputs, read by it alone, write
    float (LiteRT's converter puts a float concatenation with one dequantized input on that input's grid, and with
    it every other input: YOLOv8's class scores, concatenated with its boxes in pixels, became 0 or 1.25)."""

    fold_quantize: bool = True
    average_grids: bool = True
    same_scale_concat: bool = False
    requantize_edges: bool = True
    transposed_convs: bool = False
    float_concat_inputs: bool = False

    @property
    def tied_passing(self) -> bool:
        """Whether a pass-through op (a view, a slice) writes its input's grid: where no edge is requantized, there
        is no edge to put another grid on."""
        return not self.requantize_edges

    def weighted(self) -> dict[str, tuple[str, ...]]:
        """torch op -> the ONNX ops whose weights it takes the plan's integer weights of."""
        return _WEIGHTED | (_TRANSPOSED if self.transposed_convs else {})


@dataclasses.dataclass(frozen=True)
class CarriedPlan:
    """The converted torch program (q/dq ops with the plan's grids) and what was carried onto it."""

    program: torch.fx.GraphModule
    matched: int  # torch tensors matched to ONNX tensors by value
    activations: int  # activation grids carried from the QDQ model
    weights: int  # weights (and their biases) replaced by the plan's dequantized integers
    float_nodes: tuple[str, ...]  # torch nodes left in float because the plan keeps their ONNX twin in float
    # annotated torch tensors without a grid in the plan, and ONNX nodes whose integer weights no torch op took (the
    # caller refuses these)
    unmatched: tuple[str, ...]
    derived: tuple[str, ...] = ()  # torch tensors the ONNX model keeps in float, on an int8 grid of the plan's range
    folded: tuple[str, ...] = ()  # constant ops folded into the conv before them, as ORT folded them (torch_affines)
    # torch tensors matched to an ONNX tensor in another layout (ORT's transpose optimizer moved their op; ``layouts``)
    permuted: tuple[str, ...] = ()
    # torch nodes (not convs or linears) with no tensor in the plan, left in float: ORT's optimizer fused them (a layer
    # norm written out op by op became one LayerNormalization, quantized on its input and output only)
    unplanned: tuple[str, ...] = ()
    float_concat_inputs: tuple[str, ...] = ()  # ``CarryOptions.float_concat_inputs``: ops written float for it

    def summary(self) -> dict[str, Any]:
        return {"matched_tensors": self.matched, "activation_grids": self.activations, "weights": self.weights,
                "float_nodes": list(self.float_nodes), "unmatched": list(self.unmatched),
                "derived_from_range": list(self.derived), "folded_into_convs": list(self.folded),
                "matched_in_another_layout": list(self.permuted), "unplanned_in_float": list(self.unplanned),
                "float_concat_inputs": list(self.float_concat_inputs)}


@dataclasses.dataclass(frozen=True)
class _OnnxSide:
    """What the QDQ model says, by the float model's tensor names."""

    values: Mapping[str, np.ndarray]  # float tensor -> its value on the matching input
    order: Mapping[str, int]  # float tensor -> position of its producer
    producer: Mapping[str, onnx.NodeProto]  # float tensor -> node of the float model that writes it
    specs: Mapping[str, Any]  # tensor -> the plan's TensorSpec (float32: left unquantized by the emitter)
    weights: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]  # node -> (weight, scales, bias)
    float_nodes: frozenset[str]

    def quantized_weights(self) -> set[str]:
        """The nodes whose weights the plan put on an integer grid (``weights`` with scales)."""
        return {name for name, (_, scales, _) in self.weights.items() if len(scales)}

    def producer_op(self, node: str) -> str:
        return next((n.op_type for n in self.producer.values() if n.name == node), "?")

    def conv_written(self, tensor: str) -> bool:
        """Whether a Conv of the float model writes ``tensor``."""
        node = self.producer.get(tensor)
        return node is not None and node.op_type == "Conv"

    def weighted_producer(self, tensor: str, kinds: Sequence[str]) -> onnx.NodeProto | None:
        """The node of ``kinds`` (Conv, Gemm, MatMul) that writes ``tensor``, through the views after it: ORT fuses
        a Linear over a 3-D input (CRNN and transformer heads) into Reshape -> Gemm -> Reshape, so the tensor equal
        to torch's linear output is the last Reshape's. Else the node that writes ``tensor``."""
        node = self.producer.get(tensor)
        first = node
        for _ in range(4):
            if node is None or node.op_type in kinds or node.op_type not in _ONNX_VIEWS:
                break
            node = self.producer.get(node.input[0])
        return node if node is not None and node.op_type in kinds else first


def _onnx_side(reference: onnx.ModelProto, qdq: onnx.ModelProto, plan: QuantPlan,
               values: Mapping[str, np.ndarray]) -> _OnnxSide:
    order: dict[str, int] = {i.name: -1 for i in reference.graph.input}
    producer: dict[str, onnx.NodeProto] = {}
    for index, node in enumerate(reference.graph.node):
        for out in node.output:
            order[out] = index
            producer[out] = node
    weights = {}
    inits = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    dq_out = {n.output[0]: n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    for node in qdq.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul") or len(node.input) < 2:
            continue
        if node.input[1] in dq_out:
            dq = dq_out[node.input[1]]
            weight = dequantized(dq, inits)
            scale = inits[dq.input[1]].astype(np.float64).reshape(-1)
        elif node.input[1] in inits:  # a node left in float: its weights as the steps changed them (CLE scales a
            weight, scale = inits[node.input[1]], np.ones(0)  # float conv with the quantized conv before it)
        else:
            continue
        bias = None
        if len(node.input) > 2 and node.input[2]:
            bias = dequantized(dq_out[node.input[2]], inits) if node.input[2] in dq_out else inits.get(node.input[2])
        if node.op_type == "MatMul" or (node.op_type == "Gemm" and not node_attr(node, "transB", 0)):
            weight = weight.T  # torch's linear holds [out, in]
        weights[node.name] = (weight, scale, bias)
    return _OnnxSide(values=values, order=order, producer=producer, specs=plan.tensors, weights=weights,
                     float_nodes=frozenset(plan.float_nodes))


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    return f"{getattr(target, '__name__', str(target))}"


def _match(program: torch.fx.GraphModule, onnx_side: _OnnxSide, example: Sequence[torch.Tensor],
           permuted: dict[str, str] | None = None) -> dict[torch.fx.Node, str]:
    """Each tensor of ``program`` -> the ONNX tensor equal to it on ``example`` (see the module docstring), or where
    none is, the one equal to it up to a permutation of its axes (``layouts``: ORT's pre-processing moved the op
    into another layout), named in ``permuted`` (torch node -> how, replaced on each call)."""
    recorded: dict[torch.fx.Node, np.ndarray] = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if isinstance(result, torch.Tensor) and n.op in ("placeholder", "call_function") \
                    and result.dtype.is_floating_point:
                recorded[n] = result.detach().numpy().copy()  # in-place ops (hardtanh_) follow
            return result

    with torch.no_grad():
        _Recorder(program).run(*example)
    by_shape: dict[tuple[int, ...], list[str]] = {}
    names = sorted(onnx_side.values, key=lambda t: onnx_side.order.get(t, 1 << 30))
    for name in names:
        by_shape.setdefault(tuple(onnx_side.values[name].shape), []).append(name)
    layouts = PermutedIndex(onnx_side.values, names)
    taken: set[str] = set()
    matched: dict[torch.fx.Node, str] = {}
    if permuted is not None:
        permuted.clear()
    for node, value in recorded.items():
        scale = float(np.abs(value).max()) or 1.0
        equal = [name for name in by_shape.get(tuple(value.shape), [])
                 if float(np.abs(onnx_side.values[name] - value).max()) <= MATCH_TOLERANCE * scale]
        axes = {}
        if not equal:
            axes = dict(layouts.find(value, MATCH_TOLERANCE * scale))
            equal = list(axes)
        if equal:
            fresh = [name for name in equal if name not in taken]
            matched[node] = (fresh or equal)[0]
            taken.add(matched[node])
            if axes and permuted is not None:
                permuted[node.name] = f"{node.name} = {matched[node]} transposed {list(axes[matched[node]])}"
    return matched


def _plan_observer() -> type:
    from torchao.quantization.pt2e.observer import PerChannelMinMaxObserver

    class PlanPerChannelObserver(PerChannelMinMaxObserver):
        """Per-channel weight grid fixed by the plan ("PerChannel" in the name: PT2E passes it the channel axis)."""

        def __init__(self, scales: Sequence[float] = (1.0,), **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.register_buffer("plan_scale", torch.tensor(list(scales), dtype=torch.float32))

        def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
            return self.plan_scale, torch.zeros(self.plan_scale.shape, dtype=torch.int64)

    return PlanPerChannelObserver


@dataclasses.dataclass
class _Annotation:
    """What the plan's quantizer knows while it annotates: the ONNX side, the example input, the options, the torch
    tensors matched to ONNX tensors, and the report it fills (``carry_plan`` reads it back)."""

    onnx_side: _OnnxSide
    example: Sequence[torch.Tensor]
    options: CarryOptions
    report: dict[str, Any]
    observer: type
    match: dict[torch.fx.Node, str] = dataclasses.field(default_factory=dict)

    def spec(self, node: torch.fx.Node) -> Any:
        """The plan's spec of ``node``'s ONNX twin tensor, if matched and planned."""
        name = self.match.get(node)
        return self.onnx_side.specs.get(name) if name is not None else None

    def twin(self, node: torch.fx.Node) -> onnx.NodeProto | None:
        """The ONNX node that writes ``node``'s twin tensor, if matched (for a conv or linear, its Conv/Gemm/MatMul
        through the views ORT put after it)."""
        name = self.match.get(node)
        if name is None:
            return None
        kinds = self.options.weighted().get(_op_name(node))
        return self.onnx_side.weighted_producer(name, kinds) if kinds else self.onnx_side.producer.get(name)

    def in_float(self, node: torch.fx.Node) -> bool:
        twin = self.twin(node)
        return twin is not None and twin.name in self.onnx_side.float_nodes

    def grid(self, node: torch.fx.Node) -> Any:
        """The emitted per-tensor grid of ``node``'s ONNX twin (or of the clamp right after it) as int8; without
        ``options.average_grids``, an average's (and its views') is its input's."""
        if not self.options.average_grids and (source := _average_input(node)) is not None:
            # a source the plan leaves unquantized (ORT's PRelu) is annotated on its range's grid (``range_grid``)
            return self.grid(source) or self.range_grid(source)
        if node not in self.match and _op_name(node) in _VIEWS + _PASSING and node.args \
                and isinstance(node.args[0], torch.fx.Node):
            # a view or a slice the ONNX model has no tensor for (ORT's optimizer wrote YOLOX's four strided slices
            # of the image and their concatenation as SpaceToDepth and Gather): its values are some of its
            # input's, on its input's grid
            return self.grid(node.args[0])
        spec = self.spec(node)
        if spec is None or spec.is_float or spec.scale is None or spec.axis is not None:
            users = list(node.users)
            if len(users) == 1 and _op_name(users[0]) in _CLAMPS:
                return self.grid(users[0])
            return None
        if spec.dtype not in ("uint8", "int8"):
            return None
        return _fixed_int8(spec.scale[0], spec.zero_point[0] - (128 if spec.dtype == "uint8" else 0))

    def range_grid(self, node: torch.fx.Node) -> Any:
        """An int8 grid on the plan's calibrated range of a tensor the ONNX model left in float (the output of a Gemm
        that ORT's integer kernel writes in float; XNNPACK's quantized linear writes int8)."""
        spec = self.spec(node)
        if spec is None or spec.range is None:
            return None
        scale, zero = activation_qparams(spec.range[0], spec.range[1], signed=True, symmetric=False)
        return _fixed_int8(float(scale), int(zero))

    def weight_spec(self, node: torch.fx.Node, spec: Any) -> Any:
        """XNNPACK's weight spec of ``node`` with the plan's per-channel scales as a fixed observer."""
        twin = self.twin(node)
        carried = self.onnx_side.weights.get(twin.name) if twin is not None else None
        if carried is None or not len(carried[1]):  # no twin, or a twin the plan keeps in float
            self.report.setdefault("unmatched_weights", []).append(node.name)
            return spec
        _, scales, _ = carried
        axis = _WEIGHT_AXIS.get(_op_name(node), 0)
        channels = int(node.args[1].meta["val"].shape[axis]) if "val" in node.args[1].meta else len(scales)
        if len(scales) == 1:
            scales = np.repeat(scales, channels)
        scales = _live_scales(scales)
        # ORT's symmetric int8 grids reach -128 (scale = max |w| / 127.5): the range is the dtype's
        return dataclasses.replace(spec, qscheme=torch.per_channel_symmetric, ch_axis=axis, quant_min=-128,
                                   quant_max=127,
                                   observer_or_fake_quant_ctr=self.observer.with_args(scales=tuple(scales)))


def _live_scales(scales: np.ndarray) -> np.ndarray:
    """``scales`` with each channel's below ``DEAD_SCALE`` (a dead channel: CLE shrank PP-OCRv4's detector's to
    weights of 1e-35, and ORT gave it a scale of 7.5e-37) replaced by the median of the others: its weights round to
    0 on either (they were 0 in float32 arithmetic anyway), and its bias, on the input's scale times this one, is a
    normal float32 number: XNNPACK refused the subnormal scale ('Failed to define tensor ... xnn_status_invalid_
    parameter', the .pte did not load)."""
    scales = np.asarray(scales, dtype=np.float64)
    dead = ~(scales >= DEAD_SCALE)
    if not dead.any():
        return scales
    live = scales[~dead]
    return np.where(dead, float(np.median(live)) if live.size else 1.0, scales)


def _fixed_int8(scale: float, zero: int) -> Any:
    """A per-tensor int8 grid fixed to ``scale`` and ``zero`` (XNNPACK's qs8 activations)."""
    from torchao.quantization.pt2e.quantizer import FixedQParamsQuantizationSpec

    return FixedQParamsQuantizationSpec(dtype=torch.int8, scale=float(scale), zero_point=int(zero), quant_min=-128,
                                        quant_max=127, qscheme=torch.per_tensor_affine)


def _plan_quantizer(onnx_side: _OnnxSide, example: Sequence[torch.Tensor], report: dict[str, Any],
                    options: CarryOptions) -> Any:
    """XNNPACK's quantizer with its annotation's grids and weights replaced by the plan's (the module docstring):
    ``_annotate`` does the replacing, ``_unshare`` and ``_same_scale_concats`` the sharing that follows from it."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                         get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantizer import Quantizer

    state = _Annotation(onnx_side=onnx_side, example=example, options=options, report=report,
                        observer=_plan_observer())

    class PlanQuantizer(Quantizer):
        def __init__(self) -> None:
            super().__init__()
            self.base = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))

        def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            model = self.base.transform_for_annotation(model)
            _own_weight_nodes(model, options.weighted())
            # BatchNorm is folded by now, as in the ONNX model; what the program computes from its buffers alone (a
            # frozen BatchNorm's scale and shift) is folded into constants, as the ONNX exporter folds it; then the
            # constant scales ORT folded into convs are folded there too
            fold_buffer_computations(model)
            permuted: dict[str, str] = {}
            report["folded"], state.match = fold_matched_affines(
                model, lambda m: _match(m, onnx_side, example, permuted), onnx_side.conv_written)
            report["permuted"] = [permuted[node.name] for node in state.match if node.name in permuted]
            report["matched"] = len(state.match)
            carried = _carry_weights(model, state.match, onnx_side, options.weighted())
            report["weights"] = len(carried & onnx_side.quantized_weights())  # on the plan's integers; a float
            # layer's weights are carried too (the plan's float values, AdaRound's or CLE's where they moved them)
            report["uncarried_weights"] = [f"{name} (its {onnx_side.producer_op(name)} weights)" for name in
                                           sorted(onnx_side.quantized_weights() - carried)]
            return model

        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            self.base.annotate(model)
            floats = _annotate(model, state)
            _unshare(model, state, set(floats))
            if options.float_concat_inputs:
                _float_concat_inputs(model, state)
            if options.same_scale_concat:
                _same_scale_concats(model, state)
            return model

        def validate(self, model: torch.fx.GraphModule) -> None:
            return None

    return PlanQuantizer()


def _own_weight_nodes(model: torch.fx.GraphModule, weighted: Mapping[str, Any]) -> None:
    """Each weighted op (conv, linear) reads a weight and bias of its own: a module called twice (``c(x + big) -
    c(big)``) gives its calls one weight node, and XNNPACK's quantizer skips a conv whose weight is annotated
    already, so the second call ran float weights on an int8 input, which XNNPACK refused at load ('Failed to
    create depthwise convolution node'). A copy, not a second node of the same attribute: the lowering keeps one
    constant per attribute, and the two calls' int32 biases differ (each on its input's scale; one shared: 13 dB
    from the program). The carry gives each copy the plan's integers (its ONNX twin's)."""
    copies = 0
    for node in list(model.graph.nodes):
        if node.op != "call_function" or _op_name(node) not in weighted:
            continue
        for slot in (1, 2):
            arg = node.args[slot] if len(node.args) > slot else None
            if not (isinstance(arg, torch.fx.Node) and arg.op == "get_attr" and len(arg.users) > 1):
                continue
            value = operator.attrgetter(str(arg.target))(model)
            name = f"_npukit_own_{copies}"
            copies += 1
            if isinstance(value, torch.nn.Parameter):
                model.register_parameter(name, torch.nn.Parameter(value.detach().clone(), requires_grad=False))
            else:
                model.register_buffer(name, value.detach().clone())
            with model.graph.inserting_before(node):
                own = model.graph.get_attr(name)
            own.meta = dict(arg.meta)
            node.replace_input_with(arg, own)
    model.recompile()


def _annotate(model: torch.fx.GraphModule, state: _Annotation) -> list[torch.fx.Node]:
    """XNNPACK's annotation of ``model`` with the plan's grids in place of its observers' (weights: the plan's
    scales), nodes the plan keeps in float unannotated (returned), what has no grid in the plan named in the
    report."""
    from torchao.quantization.pt2e.quantizer import QuantizationSpec, SharedQuantizationSpec

    unmatched: list[str] = []
    floats: list[torch.fx.Node] = []
    unplanned: list[str] = []
    derived: list[str] = []
    carried = 0
    weighted = state.options.weighted()
    for node in model.graph.nodes:
        annotation = node.meta.get("quantization_annotation")
        if annotation is None:
            continue
        if state.in_float(node):
            del node.meta["quantization_annotation"]
            floats.append(node)
            continue
        inputs, output, missing, found, count = _node_grids(model, node, annotation, state)
        if missing and _op_name(node) not in weighted:
            # no tensor of the plan for it (ORT's optimizer fused the ops around it: a layer norm written out as
            # means and divisions became one LayerNormalization, quantized on its input and output only): in float,
            # as the QDQ model computes it between those grids
            del node.meta["quantization_annotation"]
            floats.append(node)
            unplanned.append(node.name)
            continue
        unmatched += missing
        derived += found
        carried += count
        annotation.input_qspec_map = inputs
        if isinstance(annotation.output_qspec, QuantizationSpec):
            annotation.output_qspec = output or annotation.output_qspec
        elif isinstance(annotation.output_qspec, SharedQuantizationSpec) and state.options.average_grids \
                and _op_name(node) in _REQUANTIZING:
            grid = state.grid(node)  # an average's own, narrower grid, as ORT gives it
            if grid is not None:
                annotation.output_qspec = grid
                carried += 1
    state.report.update(activations=carried, unmatched=unmatched, derived=derived, unplanned=unplanned,
                        float_nodes=[n.name for n in floats if n.name not in unplanned])
    return floats


def _node_grids(model: torch.fx.GraphModule, node: torch.fx.Node, annotation: Any, state: _Annotation
                ) -> tuple[dict[torch.fx.Node, Any], Any, list[str], list[str], int]:
    """``node``'s annotation with the plan's grids: (its input specs, its output spec (None where it has none), what
    has no grid in the plan, what took a grid derived from a value or a range, how many grids it took)."""
    from torchao.quantization.pt2e.quantizer import QuantizationSpec

    inputs, missing, found, count = {}, [], [], 0
    for arg, spec in annotation.input_qspec_map.items():
        if isinstance(spec, QuantizationSpec) and spec.qscheme in (torch.per_channel_symmetric,
                                                                   torch.per_tensor_symmetric) \
                and arg.op == "get_attr":
            inputs[arg] = state.weight_spec(node, spec)
        elif isinstance(spec, QuantizationSpec):
            grid = state.grid(arg)
            if grid is None and arg.op == "get_attr":  # a constant only the torch program holds as a tensor
                grid = _constant_grid(model, arg)  # (a detector's box * 64): the ONNX model's initializer
                if grid is not None:
                    found.append(arg.name)
            count += grid is not None
            if grid is None:
                missing.append(f"{arg.name} (read by {node.name})")
            inputs[arg] = grid or spec
        else:
            inputs[arg] = spec
    output = annotation.output_qspec
    if isinstance(output, QuantizationSpec):
        output = state.grid(node)
        if output is None:
            output = state.range_grid(node)
            if output is not None:
                found.append(node.name)
        count += output is not None
        if output is None:
            missing.append(node.name)
    return inputs, output, missing, found, count


def _constant_grid(model: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    """An int8 grid over a constant tensor's values and zero, as ORT's quantizer gives a constant input of a Mul or
    Add in the QDQ model (asymmetric over [min(0, v), max(0, v)]: a scalar lands exactly on it); None for anything
    but a float tensor attribute."""
    try:
        value = operator.attrgetter(str(node.target))(model)
    except AttributeError:
        return None
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0:
        return None
    values = value.detach().float()
    scale, zero = activation_qparams(min(float(values.min()), 0.0), max(float(values.max()), 0.0), signed=True,
                                     symmetric=False)
    return _fixed_int8(float(scale), int(zero))


def _unshare(model: torch.fx.GraphModule, state: _Annotation, removed: set[torch.fx.Node]) -> None:
    """Grids shared with what is now left in float (a Relu after a float conv, or a pooling that shared the grid
    of such a Relu's edge) become the plan's own grid of their tensor, or none; repeated until nothing shares
    with an edge or output that no longer has a grid (sharing chains: Relu -> pooling -> flatten)."""
    from torchao.quantization.pt2e.quantizer import SharedQuantizationSpec

    def has_grid(where: Any) -> bool:
        if isinstance(where, tuple):  # an edge (producer, consumer): quantized where the consumer's map has it
            producer, consumer = where
            annotation = consumer.meta.get("quantization_annotation")
            return producer not in removed and annotation is not None and producer in annotation.input_qspec_map
        annotation = where.meta.get("quantization_annotation")
        return where not in removed and annotation is not None and annotation.output_qspec is not None

    def gone(spec: Any) -> bool:
        return isinstance(spec, SharedQuantizationSpec) and not has_grid(spec.edge_or_node)

    if not removed:
        return
    changed = True
    while changed:
        changed = False
        for node in model.graph.nodes:
            annotation = node.meta.get("quantization_annotation")
            if annotation is None:
                continue
            inputs = {}
            for arg, spec in annotation.input_qspec_map.items():
                if gone(spec):
                    changed = True
                    spec = state.grid(arg)
                    if spec is None:
                        continue  # the edge stays float, like the node it shared with
                inputs[arg] = spec
            annotation.input_qspec_map = inputs
            if gone(annotation.output_qspec):
                changed = True
                annotation.output_qspec = _passed_grid(node, inputs) or state.grid(node)


def _float_concat_inputs(model: torch.fx.GraphModule, state: _Annotation) -> None:
    """The ops other than convs and linears that write a float concatenation's inputs, through views, and that only
    it reads, write float (``CarryOptions.float_concat_inputs``); what shared their grid is given its own."""
    weighted = state.options.weighted()
    floated: set[torch.fx.Node] = set()
    for node in model.graph.nodes:
        if _op_name(node) not in _CONCATS or node.meta.get("quantization_annotation") is not None:
            continue
        for arg in node.args[0]:
            while isinstance(arg, torch.fx.Node) and _op_name(arg) in _VIEWS and len(arg.users) == 1:
                arg = arg.args[0]
            annotation = arg.meta.get("quantization_annotation") if isinstance(arg, torch.fx.Node) else None
            if annotation is not None and annotation.output_qspec is not None and len(arg.users) == 1 \
                    and _op_name(arg) not in weighted:
                annotation.output_qspec = None
                floated.add(arg)
    if floated:
        state.report["float_concat_inputs"] = [n.name for n in floated]
        _unshare(model, state, floated)


def _passed_grid(node: torch.fx.Node, inputs: Mapping[torch.fx.Node, Any]) -> Any:
    """The grid of the input edge of an op that passes its input's values on (a max pool, a permute), which XNNPACK
    requires its output to keep: a max pool after a float conv, its output on the plan's own grid of its tensor
    (the plan had 0.00350, its input edge 0.00341), made a U-Net's .pte fail to load ('Failed to create maxpool2d
    node: xnn_status_invalid_parameter'); None for other ops."""
    source = node.args[0] if node.args else None
    return inputs.get(source) if _op_name(node) in _PASSING and isinstance(source, torch.fx.Node) else None


def _same_scale_concats(model: torch.fx.GraphModule, state: _Annotation) -> None:
    """Each concatenation's inputs and output on the plan's grid of its output; an input's producer (``sources``:
    through the ops that pass values on) whose output nothing else reads writes that grid (no requantization on the
    edge). Without ``options.requantize_edges``, a producer that also feeds others writes the concatenation's grid
    too, and so every concatenation it feeds (DenseNet's features feed every later concatenation of their block):
    such a group shares one grid, widened to cover each member's plan range (its concatenations named in the
    report's ``derived``: their grid is not the plan's)."""
    fixed = _fixed_annotation
    concats = {node: grid for node in model.graph.nodes
               if node.meta.get("quantization_annotation") is not None and _op_name(node) in _CONCATS
               and (grid := _concat_grid(node, state)) is not None}
    # concatenation -> {its input's producer: whether the producer's value is read by this concatenation alone}
    sources = {node: {(source := _through_passing(arg, tied=state.options.tied_passing)): len(arg.users) == 1 and (
        source is arg or _reads_alone(arg, source)) for arg in node.meta["quantization_annotation"].input_qspec_map}
        for node in concats}
    group = {node: node for node in concats}  # union-find over concatenations that share a producer

    def root(node: torch.fx.Node) -> torch.fx.Node:
        while group[node] is not node:
            node = group[node]
        return node

    shared: dict[torch.fx.Node, list[Any]] = {}  # group root -> the plan grids of producers others read too
    if not state.options.requantize_edges:
        owner: dict[torch.fx.Node, torch.fx.Node] = {}
        for node in concats:
            for source, alone in sources[node].items():
                if fixed(source) is not None and not alone:
                    if source in owner:
                        group[root(node)] = root(owner[source])
                    owner[source] = node
        for source, node in owner.items():
            shared.setdefault(root(node), []).append(fixed(source).output_qspec)
    members: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in concats:
        members.setdefault(root(node), []).append(node)
    grids = {top: _covering([concats[m] for m in group_of] + shared.get(top, []))
             for top, group_of in members.items() if shared.get(top) or len(group_of) > 1}
    follow = not state.options.average_grids
    for node, grid in concats.items():
        if root(node) in grids:
            grid = grids[root(node)]
            state.report.setdefault("derived", []).append(node.name)
        annotation = node.meta["quantization_annotation"]
        inputs = list(annotation.input_qspec_map)
        annotation.output_qspec = grid
        annotation.input_qspec_map = {arg: grid for arg in inputs}
        _read_on(node, grid, averages_follow=follow)
        for source, alone in sources[node].items():
            if fixed(source) is not None and (alone or not state.options.requantize_edges):
                fixed(source).output_qspec = grid
                if state.options.requantize_edges and _op_name(source) in _CONCATS:
                    # a concatenation feeding this one (YOLOv8's head: each level's boxes and scores, then the
                    # levels): its inputs on the grid it now writes, requantized on their edges (XNNPACK refused a
                    # concatenation whose inputs and output differ: 'Failed to create cat2 node', no load)
                    inner = source.meta["quantization_annotation"]
                    inner.input_qspec_map = {arg: grid for arg in inner.input_qspec_map}
                _read_on(source, grid, averages_follow=follow)
        if not state.options.requantize_edges:  # the values passed on are read on that grid everywhere
            for arg in inputs:
                while arg not in sources[node]:
                    _read_on(arg, grid, averages_follow=follow)
                    arg = arg.args[0]


def _fixed_annotation(node: torch.fx.Node) -> Any:
    """``node``'s annotation where its output is on a fixed grid (the plan's), else None."""
    from torchao.quantization.pt2e.quantizer import FixedQParamsQuantizationSpec

    annotation = node.meta.get("quantization_annotation")
    return annotation if annotation is not None and isinstance(annotation.output_qspec,
                                                               FixedQParamsQuantizationSpec) else None


def _concat_grid(node: torch.fx.Node, state: _Annotation) -> Any:
    """The plan's grid of concatenation ``node``'s output; where the plan leaves it float (a graph output) and its
    inputs all carry grids, the grid covering theirs (derived): the converter puts an int8 concatenation's inputs
    and output on one grid whatever the plan says of its output (a detector head's boxes, concatenated over levels
    as its output, failed LiteRT's converter)."""
    grid = state.grid(node)
    if grid is not None:
        return grid
    inputs = [_fixed_annotation(_through_passing(arg, tied=state.options.tied_passing))
              for arg in node.meta["quantization_annotation"].input_qspec_map]
    if not inputs or any(i is None for i in inputs):
        return None
    state.report.setdefault("derived", []).append(node.name)
    return _covering([i.output_qspec for i in inputs])


def _read_on(node: torch.fx.Node, grid: Any, *, averages_follow: bool = False) -> None:
    """``node``'s readers read it on ``grid``, its output's: no requantization on their edges (a bias derived from
    the input's grid is then derived from the grid the input really has). A reader whose output is on its input's
    grid (a view or a pass-through op; an average, with ``averages_follow``: LiteRT's) writes ``grid`` too, and so
    on down."""
    from torchao.quantization.pt2e.quantizer import FixedQParamsQuantizationSpec, SharedQuantizationSpec

    follow = _VIEWS + _PASSING + (_REQUANTIZING if averages_follow else ())
    for user in node.users:
        read = user.meta.get("quantization_annotation")
        spec = read.input_qspec_map.get(node) if read is not None else None
        if isinstance(spec, FixedQParamsQuantizationSpec):
            read.input_qspec_map[node] = grid
        elif not isinstance(spec, SharedQuantizationSpec):  # (a shared input follows ``node`` by itself)
            continue
        if _op_name(user) in follow and isinstance(read.output_qspec, (FixedQParamsQuantizationSpec,
                                                                       SharedQuantizationSpec)):
            if isinstance(read.output_qspec, FixedQParamsQuantizationSpec):
                read.output_qspec = grid
            _read_on(user, grid, averages_follow=averages_follow)


def _through_passing(node: torch.fx.Node, *, tied: bool = False) -> torch.fx.Node:
    """The op that computes what ``node`` passes on: ``node``, or the first op above it, through ops that pass their
    input's values on or average them (a view, a nearest-neighbour resize, a max or average pool), unannotated or
    with their output on their input's grid, whose input is read by nothing else: converters give such ops one grid
    in and out (LiteRT's int8 kernels copy the integers whatever the grids). ``tied``: whatever else reads their
    input (the op whose grid such an op's output has: Inception-ResNet's reduction block concatenates a max pool of
    its input, which its conv branches read too)."""
    from torchao.quantization.pt2e.quantizer import SharedQuantizationSpec

    def passes(node: torch.fx.Node) -> bool:
        annotation = node.meta.get("quantization_annotation")
        return _op_name(node) in _VIEWS + _PASSING + _REQUANTIZING and (
            annotation is None or isinstance(annotation.output_qspec, SharedQuantizationSpec))

    while node.args and isinstance(node.args[0], torch.fx.Node) and (tied or len(node.args[0].users) == 1) \
            and passes(node):
        node = node.args[0]
    return node


def _reads_alone(arg: torch.fx.Node, source: torch.fx.Node) -> bool:
    """Every op between ``source`` and ``arg`` (``arg``'s chain of pass-through ops up to ``source``), ``source``
    included, is read by the next alone."""
    while arg is not source:
        arg = arg.args[0]
        if len(arg.users) != 1:
            return False
    return True


def _covering(grids: Sequence[Any]) -> Any:
    """The int8 grid whose range covers each of ``grids``' ranges."""
    lows = [(g.quant_min - g.zero_point) * g.scale for g in grids]
    highs = [(g.quant_max - g.zero_point) * g.scale for g in grids]
    scale, zero = activation_qparams(min(lows), max(highs), signed=True, symmetric=False)
    return _fixed_int8(float(scale), int(zero))


def _average_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input of the average (pooling, mean) ``node`` is, or is a view of; None if it is neither."""
    while _op_name(node) in _VIEWS and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    if _op_name(node) in _REQUANTIZING and isinstance(node.args[0], torch.fx.Node):
        return node.args[0]
    return None


def _carry_weights(model: torch.fx.GraphModule, match: Mapping[torch.fx.Node, str],
                   onnx_side: _OnnxSide, weighted: Mapping[str, tuple[str, ...]]) -> set[str]:
    """Replace each conv / linear weight (and bias) with the QDQ model's dequantized integers (``weighted``: torch op
    -> ONNX ops, ``CarryOptions.weighted``); the ONNX nodes whose weights were carried."""
    done: set[str] = set()
    for node, name in match.items():
        kinds = weighted.get(_op_name(node))
        twin = onnx_side.weighted_producer(name, kinds) if kinds else None
        if kinds is None or twin is None or twin.op_type not in kinds or twin.name not in onnx_side.weights:
            continue
        weight, _, bias = onnx_side.weights[twin.name]
        weight_node = node.args[1]
        bias_node = node.args[2] if len(node.args) > 2 else None
        if weight_node.op != "get_attr":
            continue
        current = operator.attrgetter(weight_node.target)(model)
        if tuple(current.shape) != weight.shape:
            continue
        _set_attribute(model, weight_node.target, torch.from_numpy(np.ascontiguousarray(weight)))
        if bias is not None and isinstance(bias_node, torch.fx.Node) and bias_node.op == "get_attr":
            _set_attribute(model, bias_node.target, torch.from_numpy(np.ascontiguousarray(bias, dtype=np.float32)))
        done.add(twin.name)
    return done


def _set_attribute(model: torch.nn.Module, target: str, value: torch.Tensor) -> None:
    owner: Any = model
    *path, last = target.split(".")
    for part in path:
        owner = getattr(owner, part)
    current = getattr(owner, last)
    if isinstance(current, torch.nn.Parameter):
        setattr(owner, last, torch.nn.Parameter(value, requires_grad=False))
    else:
        setattr(owner, last, value)


def reference_values(model: onnx.ModelProto, example: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
    """Every float tensor of ``model`` (the graph inputs included) on ``example``, by name (ONNX Runtime)."""
    from npukit.quant.calibration.calibrate import float_activations, with_outputs
    from npukit.runtime.ort import make_session

    names = float_activations(model)
    session = make_session(with_outputs(model, names))
    feeds = {i.name: np.asarray(x.detach().numpy()) for i, x in zip(session.get_inputs(), example)}
    values = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    return values | feeds


def carry_plan(module: torch.nn.Module, example: Sequence[torch.Tensor], *, float_model: onnx.ModelProto,
               qdq: onnx.ModelProto, plan: QuantPlan, options: CarryOptions = CarryOptions()) -> CarriedPlan:
    """``module`` exported (``torch.export``) and converted (PT2E) with ``plan``'s grids and weights as emitted in
    ``qdq``; ``float_model`` is the ONNX model that was quantized (before any step that changed its weights: the
    torch tensors are matched to its tensors by value on ``example``); see the module docstring; ``options``: what
    the runtime's converter needs (``CarryOptions``)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from npukit.frontend.spec import eval_mode
    from npukit.quant.qdq import named_nodes, preprocess

    work = preprocess(named_nodes(float_model))  # the names the plan and the QDQ model use
    onnx_side = _onnx_side(work, qdq, plan, reference_values(work, example))
    report: dict[str, Any] = {}
    program = torch.export.export(eval_mode(module), tuple(example)).module()
    prepared = prepare_pt2e(program, _plan_quantizer(onnx_side, example, report, options))
    with torch.no_grad():
        prepared(*example)  # fixed grids learn nothing; PT2E wants the observers run once
    converted = convert_pt2e(prepared, fold_quantize=options.fold_quantize)
    return CarriedPlan(program=converted, matched=report.get("matched", 0), activations=report.get("activations", 0),
                       weights=report.get("weights", 0), float_nodes=tuple(report.get("float_nodes", ())),
                       unmatched=tuple(report.get("unmatched", ())) + tuple(report.get("unmatched_weights", ()))
                       + tuple(report.get("uncarried_weights", ())),
                       derived=tuple(report.get("derived", ())), folded=tuple(report.get("folded", ())),
                       permuted=tuple(report.get("permuted", ())), unplanned=tuple(report.get("unplanned", ())),
                       float_concat_inputs=tuple(report.get("float_concat_inputs", ())))
