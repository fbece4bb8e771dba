"""The executorch-xnnpack and litert-xnnpack profiles: their rules on single ops, and their predictions against the
real partitioners (ExecuTorch's XnnpackPartitioner, LiteRT's XNNPACK delegate) node for node on a module built to
hit the rules both ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from npukit.targets import analyze, get_target
from tests.targets._models import make, single, vi


def _verdict(model, target="executorch-xnnpack"):
    analysis = analyze(model, get_target(target))
    return next(v for v in analysis.nodes if v.op_type != "Constant")


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.mark.parametrize("op, inits, extra, attrs, supported, reason", [
    ("ReduceMean", [_ints("a", [2, 3])], ["a"], {"keepdims": 1}, True, None),
    ("ReduceMean", [_ints("a", [2, 3])], ["a"], {"keepdims": 0}, True, None),  # npukit's pass: keepdim + view
    ("ReduceMean", [_ints("a", [1])], ["a"], {}, False, "only the mean of a 4D tensor over H and W"),
    ("Softmax", [], [], {"axis": -1}, True, None),
    ("Softmax", [], [], {"axis": 1}, False, "only over the last axis"),
    ("Unsqueeze", [_ints("a", [4])], ["a"], {}, True, None),
    ("Unsqueeze", [_ints("a", [1])], ["a"], {}, True, None),  # a static shape: a view (npukit's pass)
    ("Squeeze", [_ints("a", [0])], ["a"], {}, True, None),  # a static shape: a view (npukit's pass)
    ("LayerNormalization", [numpy_helper.from_array(np.ones(8, np.float32), "g")], ["g"], {"axis": -1}, True, None),
    ("LayerNormalization", [numpy_helper.from_array(np.ones((8, 8), np.float32), "g")], ["g"], {"axis": 2}, False,
     "only over the last axis alone"),
    ("Pow", [numpy_helper.from_array(np.array(2.0, np.float32), "p")], ["p"], {}, True, None),
    ("Pow", [numpy_helper.from_array(np.array(3.0, np.float32), "p")], ["p"], {}, False, "only exponent 2"),
    ("AveragePool", [], [], {"kernel_shape": [2, 2], "ceil_mode": 1}, False, "ceil_mode 1 not supported"),
    ("AveragePool", [], [], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, False,
     "padding counted in the average"),
    ("MaxPool", [], [], {"kernel_shape": [2, 2], "strides": [3, 3]}, False, "stride must not exceed the kernel"),
    ("Elu", [], [], {}, False, "Elu: not supported by ExecuTorch XNNPACK"),
    ("HardSigmoid", [], [], {}, True, None),  # decomposed; its scalars' copies on constants split nothing
])
def test_rules_on_single_ops(op, inits, extra, attrs, supported, reason):
    v = _verdict(single(op, inits=inits, extra_inputs=extra, **attrs))
    assert v.supported is supported, v.reasons
    if reason:
        assert any(reason in r for r in v.reasons), v.reasons


def _floats(name, values):
    return numpy_helper.from_array(np.array(values, np.float32), name)


@pytest.mark.parametrize("op, inits, extra, attrs, supported, reason", [
    # Clip(x, 0, 1) is RELU_0_TO_1, which the delegate does not take; other bounds are RELU6, RELU_N1_TO_1 or
    # MINIMUM/MAXIMUM, which it does
    ("Clip", [_floats("lo", 0), _floats("hi", 1)], ["lo", "hi"], {}, False, "RELU_0_TO_1"),
    ("Clip", [_floats("lo", 0), _floats("hi", 6)], ["lo", "hi"], {}, True, None),
    ("Clip", [_floats("lo", -1), _floats("hi", 1)], ["lo", "hi"], {}, True, None),
    ("Clip", [_floats("lo", 0)], ["lo"], {}, True, None),
    ("Clip", [_floats("hi", 1)], ["", "hi"], {}, True, None),
    # torch's hardsigmoid is taken; Paddle's slope (0.2, ONNX's default) is a clamp to [0, 1] in torch
    ("HardSigmoid", [], [], {"alpha": 1 / 6, "beta": 0.5}, True, None),
    ("HardSigmoid", [], [], {"alpha": 0.2, "beta": 0.5}, False, "RELU_0_TO_1"),
    ("HardSigmoid", [], [], {}, False, "only torch's slope"),
    # x ** 2 is a MUL, x ** 0.5 a SQRT; any other exponent stays a POW
    ("Pow", [_floats("p", 2)], ["p"], {}, True, None),
    ("Pow", [_floats("p", 0.5)], ["p"], {}, True, None),
    ("Pow", [_floats("p", 3)], ["p"], {}, False, "only a constant exponent 2"),
    ("Pow", [_floats("p", -1)], ["p"], {}, False, "only a constant exponent 2"),
    # nearest is RESIZE_NEAREST_NEIGHBOR (ONNX's default mode), bilinear RESIZE_BILINEAR
    ("Resize", [_floats("s", [1, 1, 2, 2])], ["", "s"], {"mode": "linear"}, True, None),
    ("Resize", [_floats("s", [1, 1, 2, 2])], ["", "s"], {"mode": "nearest"}, False, "RESIZE_NEAREST_NEIGHBOR"),
    ("Resize", [_floats("s", [1, 1, 2, 2])], ["", "s"], {}, False, "RESIZE_NEAREST_NEIGHBOR"),
])
def test_litert_rules_on_single_ops(op, inits, extra, attrs, supported, reason):
    v = _verdict(single(op, inits=inits, extra_inputs=extra, **attrs), "litert-xnnpack")
    assert v.supported is supported, v.reasons
    if reason:
        assert any(reason in r for r in v.reasons), v.reasons


def test_litert_clip_bounds_as_attributes():
    """Opset 6 writes Clip's bounds as attributes: the same rule reads them."""
    assert not _verdict(single("Clip", opset=6, min=0.0, max=1.0), "litert-xnnpack").supported
    assert _verdict(single("Clip", opset=6, min=0.0, max=6.0), "litert-xnnpack").supported


def _convtranspose(channels=8, *, bias=True, bn=True, relu=True):
    """x -> ConvTranspose 2x2/2 (-> BatchNormalization) (-> Relu) -> Sigmoid, as DBNet's head (PP-OCR det) has it."""
    rng = np.random.default_rng(0)

    def tensor(shape, name):
        return numpy_helper.from_array(rng.uniform(0.5, 1.5, shape).astype(np.float32), name)

    inits = [tensor((8, channels, 2, 2), "w"), *([tensor((channels,), "b")] if bias else [])]
    nodes = [helper.make_node("ConvTranspose", ["x", "w", *(["b"] if bias else [])], ["t"], name="convt",
                              kernel_shape=[2, 2], strides=[2, 2])]
    last = "t"
    if bn:
        inits += [tensor((channels,), n) for n in ("g", "be", "m", "v")]
        nodes.append(helper.make_node("BatchNormalization", ["t", "g", "be", "m", "v"], ["n"], name="bn"))
        last = "n"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["r"], name="relu"))
        last = "r"
    nodes.append(helper.make_node("Sigmoid", [last], ["y"], name="sigmoid"))
    return make(nodes, [vi("x", [1, 8, 8, 8])], [vi("y", None)], inits)


@pytest.mark.parametrize("kwargs, left", [
    ({}, {"convt", "bn", "relu"}),                  # the BatchNorm folds in as a 4-D bias, the Relu fuses in
    ({"relu": False}, {"convt", "bn"}),
    ({"bias": False}, {"convt", "bn", "relu"}),
    ({"channels": 1}, set()),                       # one channel: the folded bias is written 1-D
    ({"bn": False}, set()),                         # its own bias only: a [C] vector, taken
])
def test_litert_convtranspose_with_a_batchnorm_stays_out(kwargs, left):
    analysis = analyze(_convtranspose(**kwargs), get_target("litert-xnnpack"))
    assert {v.name for v in analysis.nodes if not v.supported} == left
    if left:
        reasons = next(v for v in analysis.nodes if v.name == "convt").reasons
        assert any("4-D bias" in r for r in reasons), reasons


def test_executorch_says_why_a_matmul_of_activations_is_split():
    """q @ k^T on rank-3 or rank-4 activations: a bmm (the same-shape expand_copy aten.matmul writes goes, npukit's
    edge pass); batch dims that broadcast keep an expand_copy out."""
    def matmul(rank, other=None):
        shape = [1, 4, 16, 8][-rank:]
        nodes = [helper.make_node("Transpose", ["x"], ["k"], perm=[*range(rank - 2), rank - 1, rank - 2]),
                 helper.make_node("MatMul", ["x", "o" if other else "k"], ["y"])]
        inputs = [vi("x", shape)] + ([vi("o", other)] if other else [])
        return next(v for v in analyze(make(nodes, inputs, [vi("y", None)]),
                                       get_target("executorch-xnnpack")).nodes if v.op_type == "MatMul")

    assert matmul(3).supported and matmul(4).supported
    v = matmul(4, [1, 1, 8, 16])
    assert not v.supported and any("expand_copy" in r for r in v.reasons), v.reasons


def test_litert_takes_a_single_constant_index_and_unit_steps_only():
    def gather(values):
        return _verdict(single("Gather", inits=[_ints("i", values)], extra_inputs=["i"], axis=1), "litert-xnnpack")

    def slice_(step):
        inits = [_ints("s", [0]), _ints("e", [8]), _ints("a", [3]), _ints("p", [step])]
        return _verdict(single("Slice", inits=inits, extra_inputs=["s", "e", "a", "p"]), "litert-xnnpack")

    assert gather(1).supported
    assert not gather([1, 0]).supported and "only a constant single index" in gather([1, 0]).reasons[0]
    assert slice_(1).supported
    assert any("only step 1" in r for r in slice_(2).reasons)


def test_small_constant_values_reach_the_rules():
    from npukit.targets.graph_match import tensor_infos

    model = single("ReduceMean", inits=[_ints("a", [2, 3]), _ints("big", list(range(64)))], extra_inputs=["a"])
    infos = tensor_infos(model.graph)
    assert infos["a"].values == (2, 3)
    assert infos["big"].values is None  # only small constants are read


class _Mixed(torch.nn.Module):
    """Ops XNNPACK takes and ops it leaves to ExecuTorch's portable kernels, by the partitioner's own checks."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 1)
        self.conv3 = torch.nn.Conv2d(48, 8, 1)
        self.norm = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))                           # taken (BN folded)
        y = torch.nn.functional.max_pool2d(y, 2)                        # taken
        y = torch.nn.functional.elu(y)                                  # ELU: left (disabled in 1.5.1)
        y = torch.nn.functional.hardsigmoid(y) * y                      # hardsigmoid: taken (copies on constants)
        y = torch.cat([y, torch.nn.functional.interpolate(y, scale_factor=1.0, mode="nearest")], 1)[:, :8]
        y = torch.nn.functional.gelu(self.conv2(y))                     # GELU (exported with Erf): taken
        y = torch.roll(y, 1, dims=3)                                    # roll (two Slices + Concat): left
        y = y + torch.nn.functional.interpolate(y[:, :, ::2, ::2], scale_factor=2.0, mode="bilinear")  # step 2: left
        y = y * y[:, torch.tensor([1, 0, 2, 3, 4, 5, 6, 7])]              # gather by an index tensor: left
        y = torch.nn.functional.max_pool2d(y, 3, 1, 1)                  # LiteRT: padded as SAME, taken
        y = torch.nn.functional.max_pool2d(y, 3, 2, 1)                  # LiteRT: a PADV2 left outside
        y = torch.nn.functional.max_pool2d(torch.relu(y), 3, 2, 1)      # LiteRT: of a ReLU, padded with zeros
        y = self.conv3(torch.cat([y, y * 2.0, y * 3.0, y * 4.0, y * 5.0, y * 6.0], 1))  # 6 inputs: LiteRT leaves it
        s = torch.softmax(y, dim=1)                                     # softmax over channels: left
        y = torch.nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear")
        g = y.mean(dim=(2, 3), keepdim=True)                            # taken
        t = y.mean(dim=(2, 3))                                          # no keepdim: ExecuTorch takes it (npukit pass)
        z = self.norm(t) + g.flatten(1)                                 # layer norm: left
        return self.fc(z) + s.sum()


def _compare_with_the_real_partitioner(target: str, node_placement, module: torch.nn.Module | None = None,
                                       example: tuple[torch.Tensor, ...] | None = None) -> dict[str, tuple[bool, bool]]:
    """(predicted, actual) delegated for each node of ``module``'s exported program (default: _Mixed's) both sides
    have."""
    from npukit.frontend.provenance import onnx_nodes_by_origin

    torch.manual_seed(0)
    if module is None:
        module, example = _Mixed(), (torch.randn(1, 3, 16, 16),)
    module = module.eval()
    exported = torch.export.export(module, example)
    program = torch.onnx.export(exported, dynamo=True, optimize=True, opset_version=18, verbose=False)
    verdicts = {v.name: v for v in analyze(program.model_proto, get_target(target)).nodes}
    predicted = {o: all(verdicts[n].partition is not None for n in names)
                 for o, names in onnx_nodes_by_origin(program).items()}
    actual = {o: p.where == "delegated" for o, p in node_placement(module, example).items() if p.where != "removed"}
    return {o: (predicted[o], actual[o]) for o in actual if o in predicted}


@pytest.mark.parametrize("target, runtime, extra, least", [
    ("executorch-xnnpack", "executorch", "executorch", 15),
    ("litert-xnnpack", "litert", "litert_torch", 10),  # LiteRT fuses more: fewer nodes keep an operator
])
def test_predictions_match_the_real_partitioner_node_for_node(target, runtime, extra, least):
    import importlib

    pytest.importorskip(extra, reason=f"the {runtime} extra is not installed (scripts/setup.sh installs it)")
    node_placement = importlib.import_module(f"npukit.runtime.{runtime}").node_placement
    compared = _compare_with_the_real_partitioner(target, node_placement)
    assert len(compared) >= least
    assert any(a for _, a in compared.values()) and any(not a for _, a in compared.values())
    wrong = {o: pa for o, pa in compared.items() if pa[0] != pa[1]}
    assert not wrong, f"(predicted, actual) delegated differ: {wrong}"
