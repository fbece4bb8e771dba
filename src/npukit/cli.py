"""The ``npukit`` command: one sub-command per verb, a thin shell over :mod:`npukit.api`.

Exit codes: 0 success, 1 a numeric check failed (the message says which and what to try), 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from npukit import __version__


@dataclasses.dataclass(frozen=True)
class Verb:
    """One sub-command: the function that maps its parsed arguments onto the Python API (npukit.api), the one that
    adds its arguments to its parser, and its help line and description."""

    run: Callable[[Any, argparse.Namespace], Any]
    arguments: Callable[[argparse.ArgumentParser], None]
    help: str
    description: str | None = None


def _positive(text: str) -> int:
    """An argument that counts something: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _positive_seconds(text: str) -> float:
    """An argument that is a length of time: seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} seconds: give a finite time above 0, e.g. 3")
    return value


def _add_html(p: argparse.ArgumentParser) -> None:
    p.add_argument("--html", action="store_true", help="also write a self-contained HTML report beside the JSON one")


def _add_gate(p: argparse.ArgumentParser) -> None:
    from npukit.tasks import DEFAULT_MIN_METRIC, DEFAULT_MIN_SQNR_DB, TASKS

    p.add_argument("--task", choices=("auto",) + TASKS, default="auto",
                   help="how outputs are decoded and compared with the float model (auto: detected from the "
                        "outputs, and printed)")
    p.add_argument("--min-task-metric", type=float, default=None, metavar="X",
                   help=f"floor of the task metric, 0-1 (default {DEFAULT_MIN_METRIC}: top-1 agreement, mAP@0.5, "
                        "mIoU, text-box F1 or character and whole-line agreement against the float model)")
    p.add_argument("--min-sqnr", type=float, default=DEFAULT_MIN_SQNR_DB, metavar="DB",
                   help=f"floor of the SQNR of every output the task does not decode (default {DEFAULT_MIN_SQNR_DB:g})")
    p.add_argument("--accept-degraded", action="store_true",
                   help="exit 0 even below the floors (the report's verdict then says DEGRADED)")


def _gate(args: argparse.Namespace):
    from npukit.tasks import QualityGate

    return QualityGate(min_metric=args.min_task_metric, min_sqnr_db=args.min_sqnr,
                       accept_degraded=args.accept_degraded)


def _add_training_data(p: argparse.ArgumentParser, *, output: str) -> None:
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", required=True, help=output)
    p.add_argument("--data", required=True, help="training samples (image folder, with class subfolders for "
                                                 "labels; .npy; .npz with 'labels')")
    p.add_argument("--eval", dest="eval_data", help="held-out samples for the check (default: every 5th sample of "
                                                     "--data, never trained on)")


def _add_training(p: argparse.ArgumentParser, *, passes: str, lr: str) -> None:
    p.add_argument("--epochs", type=_positive, default=3, help=f"{passes} (default 3)")
    p.add_argument("--batch-size", type=_positive, default=16, help="samples per step, over all processes (default 16)")
    p.add_argument("--lr", type=float, help=lr)
    p.add_argument("--no-augment", action="store_true", help="no random shifts or blends of image inputs")
    p.add_argument("--mixup", type=float, default=0.0, metavar="SHARE",
                   help="share of each batch's images blended with another of the batch, teacher and student "
                        "alike (unlabeled data only; default 0: off)")
    p.add_argument("--max-steps", type=_positive, help="steps per epoch at most (default: every sample once)")


def _add_training_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--restart", action="store_true", help="ignore the checkpoint of an earlier run and start over")
    p.add_argument("--seed", type=int, default=0, help="seed of the batches and shifts (default 0)")
    p.add_argument("--threads", type=int, help="torch and ORT threads (default: torch's)")
    p.add_argument("--runs", type=_positive, default=20, help="timed runs per model (default 20)")
    p.add_argument("--max-samples", type=_positive, help="check on at most this many held-out samples")
    _add_gate(p)
    _add_shape(p, "static input shape, e.g. 1,3,224,224")
    _add_html(p)


def _add_shape(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--input-shape", action="append", metavar="[NAME=]N,C,H,W",
                   help=help_text + "; or NAME=1,3,224,224 to give an input by name (repeatable, once per input). "
                                    "Fixed into the model first: every check, count and plan uses these shapes")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in npukit's form: one line on stderr saying what is wrong and where the usage is
    (argparse's own prints the whole usage first), exit 2."""

    def error(self, message: str) -> NoReturn:
        from npukit.report.terminal import print_error

        print_error(f"{self.prog}: {message}. See `{self.prog} -h` for the arguments.")
        self.exit(2)

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """As argparse's, but an argument no verb knows is named with the verb's usage (argparse reports it from
        the top-level parser, which pointed at `npukit -h`)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            verb = getattr(parsed, "verb", None)
            prog = f"{self.prog} {verb}" if verb else self.prog
            from npukit.report.terminal import print_error

            print_error(f"{prog}: unrecognized arguments: {' '.join(extras)}. See `{prog} -h` for the arguments.")
            self.exit(2)
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="npukit",
        description="Turn a PyTorch or ONNX model into a fast, small, verified artifact for phones and NPUs, "
                    "and measure it.")
    parser.add_argument("--version", action="version", version=f"npukit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    # --debug after the verb too (npukit compile ... --debug); unset there, the top-level value stands
    verb_options = argparse.ArgumentParser(add_help=False)
    verb_options.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                              help="show full tracebacks")
    for name, verb in VERBS.items():
        kwargs = {"help": verb.help} | ({"description": verb.description} if verb.description else {})
        verb.arguments(sub.add_parser(name, parents=[verb_options], **kwargs))
    return parser


# ------------------------------------------------------------------------------------------ each verb's arguments

def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL")
    p.add_argument("-o", "--output", required=True, help="output .onnx path")
    p.add_argument("--weights", help="state dict file (torch.save(model.state_dict()), also nested under "
                                     "'state_dict'/'model'/'model_state_dict', a 'module.' prefix stripped; or "
                                     ".safetensors) for torchvision:NAME, module:factory or a pickled nn.Module")
    _add_shape(p, "input shape, e.g. 1,3,224,224 (default: the model's usual one)")
    p.add_argument("--dynamic-batch", action="store_true", help="make the batch dimension symbolic")
    p.add_argument("--opset", type=int, default=None,
                   help="ONNX opset (17-23; default 18 for a PyTorch model; an .onnx file keeps its own unless "
                        "given, then it is converted up and verified)")
    p.add_argument("--exporter", choices=("auto", "dynamo", "torchscript"), default="auto",
                   help="auto: torch.export-based exporter, falling back to the TorchScript one")
    p.add_argument("--rtol", type=float, default=1e-4, help="max error relative to the output range (default 1e-4)")
    _add_html(p)


def _optimize_graph_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", required=True, help="output .onnx path")
    p.add_argument("--skip-pass", action="append", default=[], metavar="NAME", help="leave a pass out (repeatable)")
    p.add_argument("--no-verify", action="store_true", help="skip the numerical check against the original")
    p.add_argument("--rtol", type=float, default=1e-4, help="max error relative to the output range (default 1e-4)")
    _add_shape(p, "static input shapes for symbolic dimensions, e.g. 1,3,640,640 (the output keeps them)")
    p.add_argument("--memory-budget", type=_positive, metavar="BYTES",
                   help="restructure (ORT CPU: plain-layout upsamples; then spatial tiles of the high-resolution "
                        "stem) so the predicted peak activation memory fits BYTES")
    _add_html(p)


def _inspect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx")
    _add_shape(p, "input shape when the model's is symbolic")
    p.add_argument("--top", type=_positive, default=15, help="layers to list by MACs (default 15)")
    p.add_argument("--json", metavar="PATH", help="also write the summary as a JSON report")


def _quantize_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--calib", required=True, help="calibration data: image folder, .npy or .npz")
    p.add_argument("-o", "--output", required=True, help="output .onnx path")
    _add_preprocess(p)
    _add_gate(p)
    _add_quant_scheme(p)
    _add_quant_recipe(p)
    _add_quant_precision(p)
    _add_quant_cpu_kernels(p)
    _add_quant_check(p)


def _add_quant_scheme(p: argparse.ArgumentParser) -> None:
    """quantize's weight granularity and activation range observer."""
    from npukit.quant.calibration.observers import METHODS

    p.add_argument("--per-tensor", action="store_true", help="per-tensor weights (default per-channel)")
    p.add_argument("--method", choices=METHODS, default="auto",
                   help="activation range observer; auto (default) calibrates once and keeps the method whose "
                        "outputs best match the float model on held-out calibration samples")


def _add_quant_recipe(p: argparse.ArgumentParser) -> None:
    """quantize's recovery recipe and the recovery steps it runs (``verbs.quantize.resolve_recipe``)."""
    from npukit.quant.recipe import RECIPES

    p.add_argument("--recipe", choices=RECIPES, default="plain",
                   help="plain (default): only the recovery flags given below; equalized: adds --cle "
                        "--equalize-activations --bias-correction; auto: tries plain and equalized on held-out "
                        "calibration samples and keeps plain unless equalized is clearly better there, within "
                        "--recipe-budget (no recipe flag may be given with it)")
    p.add_argument("--recipe-budget", type=float, default=60.0, metavar="SECONDS",
                   help="with --recipe auto, a recipe after the first is tried only while the time spent stays "
                        "within this (default 60)")
    p.add_argument("--cle", action="store_true", help="cross-layer equalization first")
    p.add_argument("--equalize-activations", action="store_true",
                   help="scale the channels of residual/linear streams towards equal ranges (exact in float)")
    p.add_argument("--bias-correction", action="store_true", help="empirical bias correction")
    p.add_argument("--adaround", action="store_true", help="learned weight rounding (AdaRound, torch autograd)")
    p.add_argument("--range-search", action="store_true",
                   help="last step: rescale activation ranges where that brings the outputs closer to the float "
                        "model's on the calibration data (minutes)")


def _add_quant_precision(p: argparse.ArgumentParser) -> None:
    """quantize's nodes kept in float or at 16 bits: named, within a latency budget, or chosen per layer."""
    p.add_argument("--exclude", nargs="+", default=[], metavar="NODE", help="nodes to keep in float")
    p.add_argument("--int16", nargs="+", default=[], metavar="NODE", help="nodes with 16-bit activations")
    p.add_argument("--int16-tensors", nargs="+", default=[], metavar="TENSOR",
                   help="activations quantized to 16 bits (only the nodes reading or writing them leave int8)")
    p.add_argument("--int16-budget", type=float, default=0.0, metavar="FRACTION",
                   help="lift to 16 bits the activations whose rounding costs the outputs most per millisecond "
                        "the lift adds, adding at most this fraction to the int8 model's latency (e.g. 0.1; chosen "
                        "on the calibration data, latency measured on this machine)")
    p.add_argument("--mixed-precision", action="store_true",
                   help="choose each layer's precision (int8, 16-bit activations or float32) so that the model "
                        "meets --min-task-metric / --min-sqnr on the calibration data with the least latency added "
                        "(each option's gain and cost measured on this machine; minutes)")
    p.add_argument("--mixed-precision-layers", type=_positive, default=24, metavar="N",
                   help="layers whose options are measured per round, the most sensitive first; more are "
                        "measured while no plan meets the floors (default 24)")


def _add_quant_cpu_kernels(p: argparse.ArgumentParser) -> None:
    """quantize's choices for ORT's int8 kernels on this CPU (auto: what this CPU's scheme takes)."""
    p.add_argument("--activations", choices=("auto", "uint8", "int8"), default="auto",
                   help="activation dtype (auto: what this CPU's int8 kernels run accurately)")
    p.add_argument("--reduce-range", choices=("auto", "on", "off"), default="auto",
                   help="7-bit weights; auto: on for x86 CPUs without VNNI, where ORT's u8s8 kernels saturate")
    p.add_argument("--float-stem", choices=("auto", "on", "off"), default="auto",
                   help="keep a 3x3 RGB-style stem conv (reading the float input, <= 32 values per output) in float, "
                        "and the convs chained after it as far as that is timed fastest here; auto: on for x86 CPUs, "
                        "where the stem runs faster in float")
    # --input-shape sits here in the help; moving it to the model's arguments would reorder the help
    _add_shape(p, "static input shapes for symbolic dimensions, e.g. 1,3,640,640 (needed when the model's are "
                  "symbolic; the calibration data must have them)")
    p.add_argument("--gemm-convs", choices=("auto", "on", "off"), default="auto",
                   help="time each int8 conv on ORT's two int8 conv kernels and move those faster on its general "
                        "GEMM (AMX where the CPU has it) there; exact where both kernels accumulate in 32 bits, "
                        "refused (exit 2) where they were measured saturating (see npukit devices); auto: on for x86 "
                        "CPUs with VNNI or AMX")
    p.add_argument("--no-pair-channels", action="store_true",
                   help="keep the channel order (by default, per-channel weights on the reduce-range grid without "
                        "bias correction get channels reordered so each large weight shares its kernel pair with a "
                        "small one; exact in float)")


def _add_quant_check(p: argparse.ArgumentParser) -> None:
    """quantize's samples, the held-out data of its check, the timing, the HTML report."""
    p.add_argument("--calib-samples", type=_positive, help="use exactly this many calibration samples")
    p.add_argument("--data", help="held-out data to measure agreement with the float model")
    p.add_argument("--max-samples", type=_positive, help="use at most this many --data samples")
    p.add_argument("--threads", type=int, default=1, help="ORT threads for timing (default 1)")
    p.add_argument("--runs", type=_positive, default=30, help="timed runs per model (default 30)")
    _add_html(p)


def _analyze_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="an .onnx file, or a PyTorch model (torchvision:NAME, "
                                                  "module:factory, .pt2, TorchScript .pt): its ONNX export is analyzed")
    p.add_argument("--weights", help="state dict (.pt/.pth/.safetensors) for a PyTorch MODEL")
    p.add_argument("--target", action="append", required=True, metavar="T",
                   help="cpu, qnn-htp[@SOC], nnapi[@LEVEL], coreml, xnnpack (ORT's EP), executorch-xnnpack, litert "
                        "(TFLite builtins), litert-xnnpack (repeatable)")
    _add_shape(p, "input shape to fix symbolic dimensions")
    p.add_argument("--fix", action="store_true", help="apply the safe substitutions, verified numerically")
    p.add_argument("-o", "--output", help="where --fix writes the fixed model (.onnx)")
    p.add_argument("--report", metavar="PATH.json", help="write the JSON report here")
    _add_html(p)


def _plan_memory_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--target", default="cpu", help="execution view: cpu, cpu-int8, qnn-htp, unfused (default cpu)")
    _add_shape(p, "input shape to resolve symbolic dimensions")
    p.add_argument("--no-order-search", action="store_true", help="keep the model's execution order")
    p.add_argument("--rules-view", action="store_true",
                   help="for --target cpu, apply npukit's rule-based view to the exported graph instead of reading "
                        "the graph ORT CPU executes from ORT (and replaying ORT's allocation)")
    p.add_argument("--report", metavar="PATH.json", help="write the JSON report here")
    _add_html(p)


def _devices_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", metavar="PATH.json", help="write the JSON report here")
    p.add_argument("--html", action="store_true", help="also write a self-contained HTML report beside --report's")


def _add_preprocess(p: argparse.ArgumentParser) -> None:
    """How image files (a folder or an image given as data) become the model's input; arrays are taken as they are."""
    p.add_argument("--size", type=_positive, default=224, help="image crop size (default 224; the model's own wins)")
    p.add_argument("--resize", type=_positive, help="resize the short side to this before cropping (default: the "
                   "crop size / 0.875, 256 for 224)")
    p.add_argument("--mean", default="0.485,0.456,0.406",
                   help="per-channel mean of images in [0, 1] (default ImageNet)")
    p.add_argument("--std", default="0.229,0.224,0.225", help="per-channel std (default ImageNet)")


def _preprocess(args: argparse.Namespace):
    from npukit.config import PreprocessConfig

    mean, std = _floats(args.mean, "--mean"), _floats(args.std, "--std")
    resize = None if args.resize is None else max(args.resize, args.size)
    return PreprocessConfig(size=args.size, resize=resize, mean=mean, std=std, channels=len(mean))


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--data", help="image folder (class subfolders give labels), image, .npy or .npz")
    p.add_argument("--reference", metavar="REF.onnx", help="the model to compare against (e.g. the FP32 export)")
    _add_gate(p)
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op threads (default 1)")
    p.add_argument("--runs", type=_positive, default=50, help="timed runs (default 50)")
    p.add_argument("--warmup", type=int, default=10, help="untimed warm-up runs (default 10)")
    p.add_argument("--max-samples", type=_positive, help="use at most this many data samples")
    _add_preprocess(p)
    p.add_argument("--target", default="cpu", help="also run on an NPU backend: qnn-htp (default: cpu only)")
    p.add_argument("--soc", help="with --target qnn-htp: the Snapdragon SoC whose HTP runs the model (default "
                                 "SM8650, Snapdragon 8 Gen 3; a compiled context runs as the SoC it was compiled for)")
    p.add_argument("--memory", action="store_true", help="measure ORT CPU's real peak activation memory")
    _add_shape(p, "static input shapes for symbolic dimensions, e.g. 1,3,640,640 (applied to MODEL and REF)")
    p.add_argument("--report", metavar="PATH.json", help="write the JSON report here")
    _add_html(p)


def _compile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="an .onnx file, or a PyTorch model (torchvision:NAME, "
                                                  "module:factory, .pt2, TorchScript .pt); the mobile targets run a "
                                                  "one-input .onnx as a torch program")
    p.add_argument("-o", "--output", required=True,
                   help="output path: .onnx (EPContext model), .pte, .tflite or .mlpackage")
    p.add_argument("--target", default="qnn-htp",
                   help="qnn-htp (default), executorch-xnnpack, litert or coreml (Core ML; run on macOS only)")
    p.add_argument("--soc", help="Snapdragon part number for qnn-htp, e.g. SM8350, SM8550, SM8650, SM8750")
    p.add_argument("--calib", help="calibration data when MODEL is float (image folder, .npy, .npz); also the "
                                   "inputs of the task check (qnn-htp: on the HTP); with executorch-xnnpack, "
                                   "litert or coreml it asks for INT8")
    p.add_argument("--data", help="held-out samples the task check reads instead of the calibration samples (image "
                                  "folder, .npy, .npz): a verdict on inputs the grids were not fitted to")
    _add_preprocess(p)
    p.add_argument("--weights", help="state dict (.pt/.pth/.safetensors) for a PyTorch MODEL")
    p.add_argument("--mixed-precision", action="store_true",
                   help="qnn-htp with --calib: start from int8 activations (the HTP's fastest) and lift layers to "
                        "16-bit activations or float16 until the --min-task-metric / --min-sqnr floors pass on the "
                        "HTP (minutes; default: 16-bit activations everywhere)")
    p.add_argument("--weight-bits", type=int, choices=(8, 4), default=8,
                   help="qnn-htp with --calib: 4 for W4A16 (int4 per-channel weights, GPTQ-rounded, half the "
                        "weights' bytes; default 8)")
    _add_gate(p)
    _add_shape(p, "static input shape, e.g. 1,3,224,224")
    _add_html(p)


def _serve_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--data", help="requests from this image folder, .npy or .npz (default: seeded random inputs)")
    p.add_argument("--device", default="cpu", help="auto | cpu | qnn-htp[@SOC] (default cpu)")
    p.add_argument("--duration", type=_positive_seconds, default=3.0,
                   help="seconds per measurement: each load point, the start-ups, the allocations (default 3)")
    p.add_argument("--max-workers", type=_positive, help="largest worker count on the curve (default: the cores)")
    p.add_argument("--loads", default="0.8,1.2,1.6",
                   help="open-loop rates as multiples of the plain loop's capacity (default 0.8,1.2,1.6)")
    p.add_argument("--max-batch", type=_positive, default=4, help="rows batched together at most (default 4; 1: off)")
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a batch waits for more (default 2)")
    p.add_argument("--prefer", choices=("throughput", "latency"), default="throughput",
                   help="what the split of the cores a runtime measures for itself optimizes: requests per second, "
                        "or one request on an idle runtime (default throughput)")
    p.add_argument("--device-concurrency", type=_positive, metavar="N",
                   help="graphs run at once on the device by every runtime measured (default: one on an NPU, no "
                        "limit on the CPU)")
    p.add_argument("--bucket", action="append", metavar="SHAPE",
                   help="serve a model with symbolic sizes through input-size buckets, one static model each (e.g. "
                        "--bucket 1,3,224,224 --bucket 1,3,320,320), compared with a session fixed to each size")
    _add_shape(p, "serve at this static input shape, e.g. 1,3,224,224")
    _add_preprocess(p)
    p.add_argument("--report", metavar="PATH.json", help="write the JSON report here")
    _add_html(p)


def _optimize_arguments(p: argparse.ArgumentParser) -> None:
    from npukit import tasks

    p.add_argument("model", metavar="MODEL", help="an .onnx model (`npukit export` makes one; executorch-xnnpack "
                   "and litert run a one-input .onnx as a torch program), or a PyTorch model (torchvision:NAME, "
                   "module:factory, .pt2, TorchScript) for executorch-xnnpack and litert")
    p.add_argument("-o", "--output", required=True,
                   help="the chosen artifact (.onnx for cpu, .pte for executorch-xnnpack, .tflite for litert)")
    p.add_argument("--data", required=True,
                   help="held-out samples (image folder, .npy, .npz); without --calib every other one calibrates")
    p.add_argument("--calib", help="calibration samples (default: every other sample of --data, 1st, 3rd, ...)")
    p.add_argument("--target", default="cpu",
                   help="cpu (ONNX Runtime CPU), executorch-xnnpack (an ExecuTorch .pte) or litert (a .tflite): "
                        "each trial measured on that runtime (default cpu)")
    p.add_argument("--weights", help="state dict (.pt/.pth/.safetensors) for a PyTorch MODEL (mobile targets)")
    p.add_argument("--budget", default="1%",
                   help="how far the task metric may fall below the float model's: 1%% or 0.01 (default 1%%)")
    p.add_argument("--prefer", choices=("latency", "size", "memory", "energy"), default="latency",
                   help="what the chosen artifact is best on among those within the budget (default latency)")
    p.add_argument("--trials", type=_positive, default=12, help="trials in the study in all, resumed ones included "
                                                          "(default 12)")
    p.add_argument("--time-budget", metavar="T", help="start no trial after T (e.g. 600, 600s, 10m, 1h)")
    p.add_argument("--space", choices=("quick", "full"), default="quick",
                   help="quick: calibration, granularity, CLE, equalization, bias correction, float head, 16-bit / "
                        "float layers; full adds AdaRound and range search (minutes a trial)")
    p.add_argument("--sampler", choices=("tpe", "nsga2"), default="tpe", help="Optuna sampler (default tpe)")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    p.add_argument("--workers", type=_positive, default=1, metavar="N",
                   help="trials built at once on Ray Tune (a local Ray instance npukit starts and stops; default 1: "
                        "one after the other, no Ray); timing stays one model at a time")
    p.add_argument("--batch", type=_positive, metavar="N",
                   help="recipes the sampler proposes at once (default: --workers); "
                   "the same batch and seed propose the same recipes with any number of workers")
    p.add_argument("--ray-address", metavar="ADDR", help="run the trials on an existing Ray cluster (e.g. HEAD:6379, "
                   "or auto) instead of a local instance; needs --workers")
    p.add_argument("--exclude", action="append", default=[], metavar="NODE", help="keep this node in float in "
                                                                                  "every trial (repeatable)")
    p.add_argument("--task", choices=("auto",) + tasks.TASKS, default="auto",
                   help="how outputs are decoded and compared with the float model (default: detected)")
    p.add_argument("--min-sqnr", type=float, default=None, metavar="DB",
                   help="floor of the SQNR of every output the task does not decode (default: the task check's)")
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op threads for timing (default 1)")
    p.add_argument("--runs", type=_positive, default=20, help="timed runs per model and trial (default 20)")
    p.add_argument("--max-samples", type=_positive, help="evaluate on at most this many held-out samples")
    _add_shape(p, "static input shape, e.g. 1,3,224,224")
    _add_preprocess(p)
    _add_html(p)


def _qat_arguments(p: argparse.ArgumentParser) -> None:
    from npukit.quant.calibration.observers import METHODS

    _add_training_data(p, output="output .onnx path")
    p.add_argument("--calib", help="calibration samples for the PTQ start (default: 64 training samples spread evenly)")
    p.add_argument("--bits", choices=("w8a8", "w4a8"), default="w8a8",
                   help="weights and activations (default w8a8; w4a8 stores int4 weights, opset 21)")
    p.add_argument("--bits-schedule", metavar="B,B,...", help="weight bits of equal parts of the training, "
                                                             "lowered step by step, e.g. 6,4 (default: the final "
                                                             "bits throughout)")
    _add_training(p, passes="passes over the training samples",
                  lr="Adam learning rate (default 5e-5 for 8-bit weights, 1e-4 for 4)")
    p.add_argument("--learn-scales", action="store_true", help="learn the grids' scales too (LSQ)")
    p.add_argument("--eight-bit-share", type=float, default=None, metavar="F",
                   help="w4a8: the fraction of the weights that may keep 8 bits, the most sensitive layers "
                        "(default 0.05; 0: every weight at 4 bits)")
    p.add_argument("--method", choices=METHODS, default="auto",
                   help="activation range observer of the PTQ start (default auto)")
    p.add_argument("--per-tensor", action="store_true", help="per-tensor weights (default per-channel)")
    p.add_argument("--exclude", nargs="+", default=[], metavar="NODE", help="nodes to keep in float")
    _add_preprocess(p)
    _add_training_run(p)


def _prune_arguments(p: argparse.ArgumentParser) -> None:
    _add_training_data(p, output="output .onnx path (float)")
    p.add_argument("--macs", type=float, metavar="FRACTION",
                   help="structured: prune channels until the MACs are this fraction of today's (e.g. 0.7)")
    p.add_argument("--sparsity", type=float, metavar="FRACTION",
                   help="unstructured: this share of the Conv/Gemm/MatMul weights set to zero (e.g. 0.9)")
    p.add_argument("--calib", help="samples that rank the channels (default: 64 training samples spread evenly)")
    _add_training(p, passes="fine-tuning passes over the training samples",
                  lr="Adam learning rate (default 1e-4, cosine-decayed)")
    _add_preprocess(p)
    _add_training_run(p)


def _substitute_arguments(p: argparse.ArgumentParser) -> None:
    _add_training_data(p, output="output .onnx path (float)")
    p.add_argument("--rule", action="append", required=True, metavar="NAME",
                   help="a substitution: hardswish_to_relu6, groupnorm_to_instancenorm, or any exact fix of "
                        "analyze (repeatable)")
    p.add_argument("--ramp", type=float, metavar="SHARE",
                   help="blend an inexact substitute in over this share of the training steps, from the original "
                        "op's output to the substitute's (default 0.5; 0: the substituted model from the first step)")
    _add_training(p, passes="fine-tuning passes over the training samples",
                  lr="Adam learning rate (default 1e-4, cosine-decayed)")
    _add_preprocess(p)
    _add_training_run(p)


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output-dir", default="npukit_out", help="where artifacts and reports go")
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op threads for timing (default 1)")
    p.add_argument("--runs", type=_positive, default=50, help="timed runs per model (default 50)")
    p.add_argument("--no-html", action="store_true", help="skip the HTML report")




def _ints(text: str, what: str) -> tuple[int, ...]:
    from npukit.errors import InputError

    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise InputError(f"{what} {text!r} is not a comma-separated list of positive integers",
                         hint="e.g. 1,3,224,224")
    return values


def _floats(text: str, what: str, example: str = "0.5,0.5,0.5") -> tuple[float, ...]:
    from npukit.errors import InputError

    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"{what} {text!r} is not a comma-separated list of numbers", hint=f"e.g. {example}") \
            from None


def _tri(value: str) -> bool | None:
    return {"auto": None, "on": True, "off": False}[value]


def _task(args: argparse.Namespace) -> str | None:
    return None if args.task == "auto" else args.task


def _export(api, args):
    return api.export(args.model, args.output, weights=args.weights, input_shape=args.input_shape,
                      dynamic_batch=args.dynamic_batch, opset=args.opset, exporter=args.exporter, rtol=args.rtol,
                      html=args.html)


def _optimize_graph(api, args):
    return api.optimize_graph(args.model, args.output, skip_passes=args.skip_pass, verify=not args.no_verify,
                              rtol=args.rtol, input_shape=args.input_shape, memory_budget=args.memory_budget,
                              html=args.html)


def _inspect(api, args):
    return api.inspect(args.model, input_shape=args.input_shape, top_layers=args.top, report_path=args.json)


def _quantize(api, args):
    return api.quantize(args.model, args.output, calib=args.calib, per_tensor=args.per_tensor, method=args.method,
                        recipe=args.recipe, recipe_budget_s=args.recipe_budget, cle=args.cle,
                        bias_correction=args.bias_correction, adaround=args.adaround,
                        range_search=args.range_search, equalize_activations=args.equalize_activations,
                        exclude=args.exclude, int16_nodes=args.int16, int16_tensors=args.int16_tensors,
                        int16_budget=args.int16_budget, mixed_precision=args.mixed_precision,
                        mixed_precision_layers=args.mixed_precision_layers,
                        activation_dtype=None if args.activations == "auto" else args.activations,
                        reduce_range=_tri(args.reduce_range), float_stem=_tri(args.float_stem),
                        gemm_convs=_tri(args.gemm_convs), calib_samples=args.calib_samples, data=args.data,
                        max_samples=args.max_samples, threads=args.threads, runs=args.runs, html=args.html,
                        pair_channels=not args.no_pair_channels,
                        task=_task(args), gate=_gate(args), input_shape=args.input_shape,
                        preprocess=_preprocess(args))


def _analyze(api, args):
    return api.analyze(args.model, targets=args.target, input_shape=args.input_shape, weights=args.weights,
                       fix=args.fix, output=args.output, report_path=args.report, html=args.html)


def _plan_memory(api, args):
    return api.plan_memory(args.model, target=args.target, input_shape=args.input_shape,
                           order_search=not args.no_order_search, runtime_graph=not args.rules_view,
                           report_path=args.report, html=args.html)


def _devices(api, args):
    return api.devices(report_path=args.report, html=args.html)


def _bench(api, args):
    return api.bench(args.model, data=args.data, reference=args.reference, threads=args.threads, runs=args.runs,
                     warmup=args.warmup, max_samples=args.max_samples, preprocess=_preprocess(args), target=args.target,
                     soc=args.soc, memory=args.memory, report_path=args.report, html=args.html, task=_task(args),
                     gate=_gate(args), input_shape=args.input_shape)


def _compile(api, args):
    return api.compile(args.model, args.output, soc=args.soc, target=args.target, calib=args.calib,
                       preprocess=_preprocess(args), input_shape=args.input_shape, html=args.html, task=_task(args),
                       gate=_gate(args), weights=args.weights, mixed_precision=args.mixed_precision,
                       weight_bits=args.weight_bits, data=args.data)


def _fraction(text: str) -> float:
    from npukit.search.study import fraction

    return fraction(text)


def _seconds(text: str | None) -> float | None:
    from npukit.errors import InputError

    if text is None:
        return None
    value = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(value[-1:], None)
    try:
        return float(value[:-1]) * scale if scale else float(value)
    except ValueError:
        raise InputError(f"--time-budget {text!r} is not a duration", hint="e.g. 600, 600s, 10m or 1h") from None


def _optimize(api, args):
    return api.optimize(args.model, args.output, data=args.data, calib=args.calib, target=args.target,
                        budget=_fraction(args.budget), prefer=args.prefer, trials=args.trials,
                        timeout_s=_seconds(args.time_budget), space=args.space, sampler=args.sampler, seed=args.seed,
                        workers=args.workers, batch=args.batch, ray_address=args.ray_address,
                        exclude=args.exclude, task=_task(args), min_sqnr_db=args.min_sqnr, threads=args.threads,
                        runs=args.runs, max_samples=args.max_samples, input_shape=args.input_shape, html=args.html,
                        weights=args.weights, preprocess=_preprocess(args))


def _qat(api, args):
    from npukit.errors import InputError

    schedule = None
    if args.bits_schedule:
        try:
            schedule = tuple(int(b) for b in args.bits_schedule.split(","))
        except ValueError:
            raise InputError(f"--bits-schedule {args.bits_schedule!r} is not a list of bit widths",
                             hint="e.g. --bits-schedule 8,6,4") from None
    return api.qat(args.model, args.output, data=args.data, eval_data=args.eval_data, calib=args.calib,
                   bits=args.bits, schedule=schedule, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                   learn_scales=args.learn_scales, augment=not args.no_augment, mixup=args.mixup,
                   max_steps=args.max_steps, eight_bit_share=args.eight_bit_share,
                   method=args.method, per_tensor=args.per_tensor, exclude=args.exclude, restart=args.restart,
                   task=_task(args), gate=_gate(args), seed=args.seed, threads=args.threads, runs=args.runs,
                   max_samples=args.max_samples, input_shape=args.input_shape, html=args.html,
                   preprocess=_preprocess(args))


def _prune(api, args):
    return api.prune(args.model, args.output, data=args.data, macs=args.macs, sparsity=args.sparsity,
                     eval_data=args.eval_data, calib=args.calib, epochs=args.epochs, batch_size=args.batch_size,
                     lr=args.lr, augment=not args.no_augment, mixup=args.mixup, max_steps=args.max_steps,
                     restart=args.restart,
                     task=_task(args), gate=_gate(args), seed=args.seed, threads=args.threads, runs=args.runs,
                     max_samples=args.max_samples, input_shape=args.input_shape, html=args.html,
                     preprocess=_preprocess(args))


def _substitute(api, args):
    return api.substitute(args.model, args.output, rules=args.rule, data=args.data, eval_data=args.eval_data,
                          epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, ramp=args.ramp,
                          augment=not args.no_augment, mixup=args.mixup,
                          max_steps=args.max_steps, restart=args.restart, task=_task(args), gate=_gate(args),
                          seed=args.seed, threads=args.threads, runs=args.runs, max_samples=args.max_samples,
                          input_shape=args.input_shape, html=args.html, preprocess=_preprocess(args))


def _demo(api, args):
    from npukit.demo_pipeline import demo

    return demo(args.output_dir, threads=args.threads, runs=args.runs, html=not args.no_html)


def _serve_bench(api, args):
    return api.serve_bench(args.model, data=args.data, device=args.device, duration_s=args.duration,
                           max_workers=args.max_workers, loads=_floats(args.loads, "--loads", "0.8,1.2,1.6"),
                           max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, prefer=args.prefer,
                           device_concurrency=args.device_concurrency, report_path=args.report,
                           html=args.html, buckets=[_ints(b, "--bucket") for b in args.bucket or ()],
                           input_shape=args.input_shape, preprocess=_preprocess(args))


# The verbs in the order ``npukit -h`` lists them.
VERBS: dict[str, Verb] = {
    "export": Verb(
        _export, _export_arguments,
        help="PyTorch (torchvision:NAME, module:factory, TorchScript, pickled module, .pt2) or ONNX -> verified ONNX",
        description="Export a model to a single-file ONNX model, verified against torch on seeded inputs. MODEL: "
                    "torchvision:NAME | package.module:factory (found in the current folder too; arguments as "
                    "'pkg.mod:factory(num_classes=5, width=0.5)', literal values only) | a model file, told by its "
                    "content: TorchScript (torch.jit.save), a pickled nn.Module (torch.save(model); loading it runs "
                    "code from the file), a torch.export .pt2, an .onnx. A state dict is not a model: give it with "
                    "--weights."),
    "optimize-graph": Verb(
        _optimize_graph, _optimize_graph_arguments,
        help="constant folding, dead code, BatchNorm folding, fusions; verified",
        description="Run npukit's graph passes and verify the result against the original."),
    "inspect": Verb(
        _inspect, _inspect_arguments,
        help="ops by type, parameters, MACs per layer, tensor sizes"),
    "quantize": Verb(
        _quantize, _quantize_arguments,
        help="INT8 post-training quantization (QDQ) with calibration, CLE, bias correction",
        description="Quantize to a QDQ model that ONNX Runtime runs with integer kernels; the report shows per-layer "
                    "SQNR, size, latency and (with --data) agreement with the float model."),
    "analyze": Verb(
        _analyze, _analyze_arguments,
        help="which nodes each target (NPU) takes, why not, and the CPU fallbacks",
        description="Before any lowering: per node supported or not and why, the partition into delegated subgraphs, "
                    "delegate<->fallback transitions, share of MACs delegated, and the substitution that would fix "
                    "each unsupported node (an ONNX model, or a PyTorch model's ONNX export)."),
    "plan-memory": Verb(
        _plan_memory, _plan_memory_arguments,
        help="tensor lifetimes, buffer reuse plans, peak memory, timeline",
        description="Plan activation memory on the graph as the target executes it (fused activations, in-place ops, "
                    "quantized activation dtypes); every plan is checked so that no two live tensors share bytes."),
    "devices": Verb(
        _devices, _devices_arguments,
        help="probe execution providers, NPU backends, CPU int8 features, memory"),
    "bench": Verb(
        _bench, _bench_arguments,
        help="latency on ORT CPU, size, and agreement/accuracy on data",
        description="Measure latency (warm-up, then median/p90), size and, with --data, agreement with a reference "
                    "model and accuracy against labels."),
    "compile": Verb(
        _compile, _compile_arguments,
        help="model -> deployable artifact: an EPContext model for a Snapdragon HTP, an ExecuTorch .pte, a LiteRT "
             ".tflite or a Core ML .mlpackage",
        description="--target qnn-htp: fix static shapes, quantize as the HTP needs (unless given a QDQ model), and "
                    "compile an EPContext model holding the HTP context binary for --soc. --target executorch-xnnpack "
                    "/ litert: lower a PyTorch model to an ExecuTorch .pte / a LiteRT .tflite run by the XNNPACK "
                    "delegate, fp32, or INT8 from npukit's plan with --calib. --target coreml: a Core ML ML Program "
                    "package the same way. The result is loaded back, run and checked (Core ML off macOS: read "
                    "back and its grids checked, not run; the verdict says so)."),
    "serve-bench": Verb(
        _serve_bench, _serve_bench_arguments,
        help="serve a model with npukit's runtime against a plain loop, under load",
        description="Replay closed-loop (N clients) and open-loop (Poisson arrivals) load in-process against a plain "
                    "one-session loop and against npukit.runtime.engine.Runtime (bound buffers, worker threads, "
                    "dynamic batching on a symbolic batch axis): start-up, jitter, allocations per call, throughput "
                    "against workers, latency percentiles and batch sizes formed."),
    "optimize": Verb(
        _optimize, _optimize_arguments,
        help="search quantization recipes under an accuracy budget; write the best artifact",
        description="A multi-objective search (Optuna) over npukit's quantization recipes on the target: each trial "
                    "builds a recipe and measures its task metric against the float model on held-out data, its "
                    "latency (ratio to the float model, timed in the same rounds), size, predicted peak memory and "
                    "estimated energy. Writes the artifact best on --prefer among the trials within --budget, with "
                    "the Pareto front and every trial in the report. The study is kept beside it (best.optimize.db "
                    "for best.onnx, m.tflite.optimize.db for m.tflite): the same command again continues it."),
    "qat": Verb(
        _qat, _qat_arguments,
        help="quantization-aware training (distillation from the float model) to 8- or 4-bit weights",
        description="Post-training quantization on this CPU's scheme, then quantization-aware training of the QDQ "
                    "model's grids in torch by distillation from the float model (labels used where the data has "
                    "them), written back as a QDQ model that computes what training simulated (checked), and held to "
                    "the task check on held-out data beside the PTQ model of the same bits. <output>.qat.pt keeps the "
                    "last finished epoch: the same command again continues an interrupted run. Under torchrun the "
                    "processes share every batch (DDP, gloo)."),
    "prune": Verb(
        _prune, _prune_arguments,
        help="structured channel pruning and/or magnitude sparsity, fine-tuned by distillation",
        description="Prune a float model, then fine-tune it by distillation from the unpruned model (labels used "
                    "where the data has them) and hold it to the task check on held-out data. --macs removes whole "
                    "channels of the convs whose channels stand alone (a smaller, faster dense model); --sparsity "
                    "raises that share of the weights to zero by magnitude while fine-tuning (npukit qat --bits w4a8 "
                    "of the result keeps the zeros). <output>.prune.pt keeps the last finished epoch: the same "
                    "command again continues an interrupted run."),
    "substitute": Verb(
        _substitute, _substitute_arguments,
        help="replace ops by inexact substitutes (HardSwish -> ReLU6, ...), fine-tuned back",
        description="Replace every node of an op by a substitute that computes a different function (for a target "
                    "without the op, or a faster int8 kernel: ReLU6 fuses into the conv before it), then fine-tune "
                    "the result by distillation from the original model (labels used where the data has them) and "
                    "hold it to the task check on held-out data; an inexact substitute is blended in step by step "
                    "(--ramp) so the network follows it. The report shows the substituted model before and "
                    "after fine-tuning. <output>.substitute.pt keeps the last finished epoch: the same command again "
                    "continues an interrupted run."),
    "demo": Verb(
        _demo, _demo_arguments,
        help="the whole pipeline on MobileNetV2 (official weights) and real photos, offline"),
}


def _resumable(args: argparse.Namespace) -> str:
    """What an interrupted verb kept that the same command continues from."""
    from npukit.report.finish import report_path_for, study_path_for

    for verb in ("qat", "prune", "substitute"):
        if args.verb == verb and report_path_for(args.output, f".{verb}.pt").exists():
            return (f" The last finished epoch is kept in {report_path_for(args.output, f'.{verb}.pt')}: run the "
                    "same command again to continue from it.")
    if args.verb == "optimize" and study_path_for(args.output).exists():
        return " Every finished trial is kept: run the same command again to continue the study."
    return ""


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from npukit import api
    from npukit.report.terminal import print_report

    class Quiet(Console):
        def on_broken_pipe(self) -> None:
            """The reader left (`npukit ... | head -1`): print nothing more; the verdict still decides the exit code
            (rich's own handler exits with 1, which would read as a failed check)."""
            self.quiet = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    out = VERBS[args.verb].run(api, args)
    print_report(out.report, console=Quiet(width=None if sys.stdout.isatty() else 140))
    return 0 if out.report.passed else 1  # exit 0 means the artifact passed its checks


_READS = ("model", "reference", "weights", "data", "calib")  # the arguments that name files a verb reads


def _outputs(args: argparse.Namespace) -> list[Path]:
    """The files a verb writes for the user: its artifact and the report (JSON, HTML) beside it, or where named."""
    from npukit.report.finish import html_path_for, report_json_for

    paths = [Path(p) for p in (getattr(args, "json", None), getattr(args, "report", None)) if p]
    if getattr(args, "report", None) and getattr(args, "html", False):
        paths.append(html_path_for(Path(args.report)))
    output = getattr(args, "output", None)
    if output:
        json_path = report_json_for(output)
        paths += [Path(output), json_path, html_path_for(json_path)]
    return paths


def _new_folders(paths: Sequence[Path]) -> list[Path]:
    """The folders above ``paths`` that do not exist yet (a verb creates them to write its outputs), outermost
    first."""
    folders: list[Path] = []
    for path in paths:
        folder = path.absolute().parent
        while not folder.exists() and folder != folder.parent:
            folders.append(folder)
            folder = folder.parent
    return sorted(set(folders), key=lambda f: len(f.parts))


def _remove_new(paths: dict[Path, bool], *, keep_resume: bool = False) -> None:
    """Delete each path of ``paths`` (path -> whether it existed before the verb ran) that the failed verb created:
    an artifact written before a later step refused or failed is not one that passed its checks. ``keep_resume``
    (an interrupted run): the artifacts and reports go, but a new folder is removed only once nothing else is left
    in it (the checkpoint or study the same command continues from stays; rmtree took it with the folder)."""
    import shutil

    from npukit._atomic import FOLDER_ARTIFACTS

    new = [path for path, existed in paths.items() if not existed and path.exists()]
    for path in new:
        if not (path.is_dir() and not path.is_symlink()):
            path.unlink(missing_ok=True)
        elif not keep_resume or path.suffix.lower() in FOLDER_ARTIFACTS:  # a Core ML package is an artifact
            shutil.rmtree(path, ignore_errors=True)
    if keep_resume:
        for folder in sorted((p for p in new if p.is_dir()), key=lambda p: -len(p.parts)):  # innermost first
            if not any(folder.iterdir()):
                folder.rmdir()


def _quiet_onnxruntime() -> None:
    """ONNX Runtime's default logger off the terminal below errors: sessions npukit makes set this themselves, but
    those a library makes (ORT's quantization tools) printed a warning per initializer they drop (144 lines before
    substitute's report on PP-OCR's classifier)."""
    try:
        import onnxruntime
    except ImportError:  # pragma: no cover - a dependency; the verbs that need it say so
        return
    onnxruntime.set_default_logger_severity(3)


def _check_report_names(args: argparse.Namespace) -> None:
    """A JSON report named by --report / --json must end in .json (a report written as x.onnx looks like a model)."""
    from npukit.errors import InputError

    for flag in ("report", "json"):
        path = getattr(args, flag, None)
        if path and Path(path).suffix.lower() != ".json":
            raise InputError(f"--{flag} {path} must end in .json", hint=f"name it like {Path(path).stem}.json")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # -h, --version (0) or the parser's one-line refusal (2): an exit code, as below
        return exc.code if isinstance(exc.code, int) else 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # torch's C++ warnings printed before the one-line error
    os.environ.setdefault("TORCH_LOGS", "-export")  # torch.export's "dimension ... specialized" lines: npukit's shapes
    _quiet_onnxruntime()
    from npukit.errors import NpukitError
    from npukit.report.terminal import print_error
    from npukit.report.capture import capture_library_messages

    outputs = _outputs(args)
    before = {path: path.exists() for path in outputs + _new_folders(outputs)}
    signals: list[int] = []  # the interrupting signals seen (SIGINT, SIGTERM)
    try:
        from npukit._atomic import check_writes

        check_writes(list(before), [getattr(args, name, None) for name in _READS])
        if args.verb == "demo":  # its folder of models and reports: a new one goes whole when the demo does not finish
            before[Path(args.output_dir)] = Path(args.output_dir).exists()
        _check_report_names(args)  # after: a report named like an input is refused as the overwrite it would be
        with capture_library_messages(), _interrupts(signals):
            code = run(args)
        if signals:  # a Ctrl-C a library swallowed (raised inside a __del__: "Exception ignored in ...")
            raise KeyboardInterrupt
        return code
    except NpukitError as exc:
        if args.debug:  # the traceback too, with the exit code the error has without --debug
            import traceback

            traceback.print_exc()
        _remove_new(before)
        print_error(exc.one_line())
        return exc.exit_code
    except KeyboardInterrupt:
        _remove_new(before, keep_resume=args.verb != "demo")  # the demo keeps nothing to continue from
        terminated = signals and signals[-1] == signal.SIGTERM
        print_error(f"{'terminated (SIGTERM)' if terminated else 'interrupted'}; nothing was left half-written."
                    + _resumable(args))
        return 143 if terminated else 130
    except Exception as exc:  # an npukit bug: say so in one line, with the way to the traceback
        _remove_new(before)  # with --debug too: the traceback is for reading, not a half-written artifact
        if args.debug:
            raise
        if isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or "bad_alloc" in str(exc):
            print_error(f"out of memory: {type(exc).__name__} while running {args.verb}. Give a smaller input shape, "
                        "fewer samples or a smaller batch, or run it on a machine with more memory.")
            return 2
        first = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else ""
        print_error(f"internal error: {type(exc).__name__}: {first}. Rerun with --debug for the traceback "
                    "and report it.")
        return 1


@contextlib.contextmanager
def _interrupts(seen: list[int]) -> Iterator[list[int]]:
    """Within the block a Ctrl-C (SIGINT) raises KeyboardInterrupt as usual, and so does SIGTERM (kill, timeout, a
    CI cancel, docker stop: it ended the process where it was, an EPContext model written and not yet checked left
    at the output); each is also recorded in ``seen``, so that one raised where Python ignores exceptions (a
    finalizer) still ends the run as interrupted. The previous handlers come back after. Off the main thread
    (where no handler can be set) ``seen`` stays empty."""
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def interrupt(signum: int, frame: Any) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def entry() -> NoReturn:
    """The console script: ``main``, then its output flushed and Ctrl-C ignored while the interpreter shuts down
    (torch's and ONNX Runtime's teardown takes seconds): a late Ctrl-C killed the finished process by SIGINT, losing
    its buffered report lines and turning a passing run's exit code into 130."""

    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
