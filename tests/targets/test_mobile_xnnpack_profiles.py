"""The executorch-xnnpack and litert-xnnpack profiles: their rules on single ops, and their predictions against the
real partitioners (ExecuTorch's XnnpackPartitioner, LiteRT's XNNPACK delegate) node for node on a module built to
hit the rules both ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import numpy_helper

from npukit.targets import analyze, get_target
from tests.targets._models import single


def _verdict(model, target="executorch-xnnpack"):
    analysis = analyze(model, get_target(target))
    return next(v for v in analysis.nodes if v.op_type != "Constant")


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.mark.parametrize("op, inits, extra, attrs, supported, reason", [
    ("ReduceMean", [_ints("a", [2, 3])], ["a"], {"keepdims": 1}, True, None),
    ("ReduceMean", [_ints("a", [2, 3])], ["a"], {"keepdims": 0}, False, "over H and W with keepdims"),
    ("ReduceMean", [_ints("a", [1])], ["a"], {}, False, "over H and W with keepdims"),
    ("Softmax", [], [], {"axis": -1}, True, None),
    ("Softmax", [], [], {"axis": 1}, False, "only over the last axis"),
    ("Unsqueeze", [_ints("a", [4])], ["a"], {}, True, None),
    ("Unsqueeze", [_ints("a", [1])], ["a"], {}, False, "only on the trailing dimension"),
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
        y = self.conv3(torch.cat([y, y * 2.0, y * 3.0, y * 4.0, y * 5.0, y * 6.0], 1))  # 6 inputs: LiteRT leaves it
        s = torch.softmax(y, dim=1)                                     # softmax over channels: left
        y = torch.nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear")
        g = y.mean(dim=(2, 3), keepdim=True)                            # taken
        t = y.mean(dim=(2, 3))                                          # keepdim=False: left
        z = self.norm(t) + g.flatten(1)                                 # layer norm: left
        return self.fc(z) + s.sum()


def _compare_with_the_real_partitioner(target: str, node_placement) -> dict[str, tuple[bool, bool]]:
    """(predicted, actual) delegated for each node of _Mixed's exported program both sides have."""
    from npukit.frontend.provenance import onnx_nodes_by_origin

    torch.manual_seed(0)
    module, example = _Mixed().eval(), (torch.randn(1, 3, 16, 16),)
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
