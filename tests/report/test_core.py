"""The environment a report records: the versions of what made its artifact."""

from __future__ import annotations

import sys
import types

from npukit.report.core import package_versions


def test_reports_name_the_optional_packages_this_process_used(monkeypatch) -> None:
    """A .pte / .tflite / .mlpackage report listed torch and onnxruntime but not executorch, litert-torch,
    ai-edge-litert or coremltools, which made the artifact; an HTP report not onnxruntime-qnn."""
    monkeypatch.delitem(sys.modules, "coremltools", raising=False)
    assert "coremltools" not in package_versions()  # not imported: not listed
    monkeypatch.setitem(sys.modules, "coremltools", types.ModuleType("coremltools"))
    versions = package_versions()
    assert "coremltools" in versions and versions["npukit"]
    assert "onnxruntime-qnn" in versions or not _installed("onnxruntime-qnn")


def _installed(name: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_a_mobile_artifact_slower_than_eager_torch_says_so() -> None:
    """A model with attention ran as a .pte at 0.47x eager torch's speed; the PASS said nothing of it. A passing
    verdict says so where the artifact is not faster; a faster one, or a FAIL, is left as it was."""
    from npukit.measure.latency import LatencyResult
    from npukit.report.compile import add_mobile_latency
    from npukit.report.core import Report

    def verdict(artifact_ms: float, *, passed: bool = True) -> str:
        report = Report("compile")
        report.set_verdict("PASS compile: fine", passed=passed)
        latency = {name: LatencyResult.from_times([ms] * 3, threads=1)
                   for name, ms in ((".pte", artifact_ms), ("eager torch fp32", 10.0), ("ORT CPU fp32", 5.0))}
        add_mobile_latency(report, latency, artifact=".pte", threads=1, runs=3)
        assert report.tables[-1].rows[0][-1] == f"{artifact_ms / 10.0:.2f}x"  # a time ratio, as bench's
        return report.verdict

    assert verdict(21.3).endswith("; the .pte takes 2.13x eager torch's time on this CPU (1 thread(s)): eager torch "
                                  "may serve better here")
    assert verdict(4.0) == "PASS compile: fine"
    assert verdict(21.3, passed=False) == "PASS compile: fine"



def test_an_int8_mobile_artifact_slower_than_its_fp32_twin_says_so() -> None:
    """An INT8 .tflite of LR-ASPP ran at 0.8x its fp32 .tflite's speed; the report timed eager torch and ORT only."""
    from npukit.measure.latency import LatencyResult
    from npukit.report.compile import add_mobile_latency
    from npukit.report.core import Report

    def verdict(int8_ms: float) -> str:
        report = Report("compile")
        report.set_verdict("PASS compile: fine", passed=True)
        latency = {name: LatencyResult.from_times([ms] * 3, threads=1) for name, ms in (
            (".tflite", int8_ms), (".tflite fp32", 3.6), ("eager torch fp32", 10.0), ("ORT CPU fp32", 5.0))}
        add_mobile_latency(report, latency, artifact=".tflite", threads=1, runs=3, fp32=".tflite fp32")
        return report.verdict

    assert verdict(4.5) == ("PASS compile: fine; the INT8 .tflite takes 1.25x the fp32 one's time on this CPU (1 "
                            "thread(s)): the fp32 artifact (compile without --calib) may serve better here")
    assert verdict(2.0) == "PASS compile: fine"
