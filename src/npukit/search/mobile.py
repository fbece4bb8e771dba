"""Trials on a mobile runtime (``npukit optimize --target executorch-xnnpack`` or ``litert``).

A trial's plan is made as on the CPU, on the model's ONNX export (``quant.qdq.quantize``), then carried onto the torch
program with fixed grids (``quant.emit.pt2e.carry_plan``), lowered by the runtime's own converter
(``runtime.executorch``: an ExecuTorch .pte with the XNNPACK delegate; ``runtime.litert``: a .tflite) and run on that
runtime: the task metric and every output's SQNR against the float model on the held-out samples, and the latency as
a ratio to the same runtime's fp32 artifact timed in the same interleaved rounds (so the ratio says what INT8 buys on
that runtime, here). The size is the artifact's bytes against the fp32 artifact's. Two figures are estimates on the
plan's QDQ graph, as on the CPU, since neither runtime reports its memory arena here: the peak activation memory
(ORT's allocation planner replayed, ``memory.layout.ort_predicted_peak``) and the energy (``measure.energy``).

The base configuration is the runtime's integer scheme: XNNPACK's qs8 kernels (ExecuTorch's delegate and LiteRT's)
take int8 asymmetric activations and int8 symmetric per-channel (or per-tensor) weights on their full range, and no
16-bit activations; none of ORT's x86 kernel workarounds (7-bit weights, the float head, conv kernel moves) applies.
"""

from __future__ import annotations

import dataclasses
import importlib
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from npukit.frontend.graph_index import GraphIndex
from npukit.quant.config import FloatHead, Precision, QuantConfig, Scheme
from npukit.quant.config import Recipe as QuantRecipe
from npukit.quant.precision.scored_head import MOBILE_SHARE
from npukit.search.space import Recipe
from npukit.search.trial import Built, TrialBuilder, TrialRunner
from npukit.tasks import judge

# the runtime's integer scheme (see the module docstring); a recipe sets granularity, method and recovery steps on it.
# The float head is chosen once, by accuracy within MOBILE_SHARE of the MACs, as compile's plan chooses it; the
# recipes keep it or not ("no-head").
XNNPACK_BASE = QuantConfig(scheme=Scheme(activation_dtype="int8"),
                           recipe=QuantRecipe(score_on="reference", fold_affines=False),
                           precision=Precision(float_head=FloatHead("accuracy", MOBILE_SHARE)))
COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def runtime_module(name: str) -> Any:
    """``npukit.runtime.<name>``: ``lower``, ``Runner``, ``CARRY`` (see ``verbs.compile_mobile.MobileTarget``)."""
    return importlib.import_module(f"npukit.runtime.{name}")


def quantized_compute(qdq: onnx.ModelProto) -> float:
    """The fraction of the QDQ model's convolutions and matrix products whose every input is dequantized from
    integers: the compute the runtime's integer kernels take (the rest runs in fp32)."""
    index = GraphIndex(qdq.graph)
    compute = [n for n in index.nodes if n.op_type in COMPUTE_OPS]
    integer = [n for n in compute if all(index.producer_op(t) == "DequantizeLinear" for t in n.input[:2] if t)]
    return len(integer) / len(compute) if compute else 0.0


def float_share_note(fraction: float) -> str:
    """The verdict's note for an INT8 artifact most of whose convolutions and matrix products stay float (the plan's
    float layers: a float head, joins of very different scales, fragile depthwise convs); "" when at least half
    run in int8 (a float stem or head is the usual, and the tables say which)."""
    if fraction >= 0.5:
        return ""
    return (f"; note: only {fraction:.0%} of its convolutions and matrix products run in int8, the plan keeps the "
            "others float (its table says which step and why): little smaller or faster than fp32")


@dataclasses.dataclass
class MobileBuilder(TrialBuilder):
    """Builds a recipe's artifact for a mobile runtime and checks it there (see the module docstring). ``module``: the
    torch module (eval mode) whose ONNX export is ``model``; ``runtime``: the module of ``npukit.runtime`` that
    lowers and runs; ``names``: the export's input and output names."""

    module: Any = None
    runtime: str = "executorch"
    names: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

    def example(self) -> tuple[Any, ...]:
        from npukit.runtime.tensors import plain_tensor

        return tuple(plain_tensor(v) for v in self.calib[0].values())

    def check(self, recipe: Recipe, result: Any, config: QuantConfig, *, start: float) -> Built:
        from npukit.quant.emit.pt2e import carry_plan

        runtime = runtime_module(self.runtime)
        example = self.example()
        carried = carry_plan(self.module, example, float_model=self.model, qdq=result.model, plan=result.plan,
                             options=runtime.CARRY)
        if carried.unmatched:
            return Built(recipe, None, error=f"the plan could not be carried onto {len(carried.unmatched)} tensor(s) "
                                             f"of the torch program ({', '.join(carried.unmatched[:3])})",
                         seconds=time.perf_counter() - start)
        lowered = runtime.lower(carried.program, example, names=self.names)
        with tempfile.TemporaryDirectory(prefix="npukit-trial-") as tmp:
            path = Path(tmp) / "trial.bin"
            path.write_bytes(lowered.buffer)
            outcome = self.compare(runtime.Runner(path, threads=self.threads))
        fraction = quantized_compute(result.model)
        failures = [] if fraction > 0 else ["no convolution or matrix product is quantized: nothing gained over fp32"]
        if why := runtime.unhonoured_floats(lowered, result.model):  # a converter that quantized float layers
            failures.append(why)
        verdict = judge(outcome, self.gate, what="trial", extra_failures=failures)
        sqnrs = [o.sqnr_db for o in outcome.outputs if o.sqnr_db == o.sqnr_db]
        return Built(recipe, result.model, passed=verdict.passed and not verdict.degraded, artifact=lowered.buffer,
                     metric_name=outcome.metric,
                     metric=float(outcome.value) if outcome.value is not None else float("nan"),
                     worst_sqnr_db=min(sqnrs) if sqnrs else float("nan"), integer_fraction=fraction,
                     failures=tuple(verdict.failures), seconds=time.perf_counter() - start)


@dataclasses.dataclass
class MobileRunner(TrialRunner):
    """Times a mobile artifact on its runtime against that runtime's fp32 artifact ``fp32`` (the bytes), one model
    at a time in this process; see the module docstring. ``close`` removes the files the runtimes load from."""

    fp32: bytes = b""
    runtime: str = "executorch"
    _folder: Any = dataclasses.field(default=None, repr=False)
    _written: int = dataclasses.field(default=0, repr=False)
    _fp32_runner: Any = dataclasses.field(default=None, repr=False)  # loaded once: every timing reads it

    def _path(self, artifact: bytes) -> Path:
        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory(prefix="npukit-optimize-run-")
        self._written += 1
        path = Path(self._folder.name) / f"{self._written}.bin"
        path.write_bytes(artifact)
        return path

    def candidate(self, artifact: bytes) -> Any:
        return runtime_module(self.runtime).Runner(self._path(artifact), threads=self.threads)

    def _reference_runner(self) -> Any:
        if self._fp32_runner is None:
            self._fp32_runner = self.candidate(self.fp32)
        return self._fp32_runner

    def artifact(self, built: Built) -> bytes | None:
        return built.artifact if built.model is not None else None

    def write(self, artifact: bytes, output: Any) -> None:
        from npukit._atomic import write_bytes_atomic

        write_bytes_atomic(Path(output), artifact)

    def _timed(self, artifacts: Mapping[str, bytes], *, runs: int, rounds: int, warmup: int) -> dict[str, float]:
        from npukit._threads import torch_threads
        from npukit.measure.latency import time_calls_interleaved

        feeds = dict(self.feeds)
        runners = {"float": self._reference_runner(), **{name: self.candidate(a) for name, a in artifacts.items()}}
        with torch_threads(self.threads):
            timed = time_calls_interleaved({n: (lambda r=r: r(feeds)) for n, r in runners.items()},
                                           threads=self.threads, warmup=warmup, runs=runs, rounds=rounds)
        return {n: t.median_ms for n, t in timed.items()}

    def time_again(self, artifacts: Mapping[str, bytes], *, runs: int) -> dict[str, tuple[float, float]]:
        timed = self._timed(artifacts, runs=runs, rounds=10, warmup=10)
        return {k: (timed[k], timed["float"]) for k in artifacts}

    def _timed_once(self, built: Built, artifact: bytes) -> tuple[float, float]:
        timed = self._timed({"candidate": artifact}, runs=self.runs, rounds=min(5, self.runs), warmup=3)
        return timed["candidate"], timed["float"]

    def close(self) -> None:
        self._fp32_runner = None
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
