"""report.bench: the HTP fidelity table says what it compared."""

from __future__ import annotations

import numpy as np

from npukit.measure.fidelity import AgreementMeter
from npukit.report.bench import add_htp_fidelity
from npukit.report.core import Report
from npukit.targets.qnn_htp import SOCS


def _results() -> dict:
    meter = AgreementMeter()
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 22))
    meter.update(ref, ref + 0.01 * rng.standard_normal((4, 22)))
    return {"HTP vs CPU run of the same model": meter.result()}


def test_a_model_without_class_scores_is_compared_by_sqnr_alone() -> None:
    """bench --target qnn-htp on YOLOv8n showed "top-1 agreement 1, top-5 overlap 0.9" for its 1x22x2100 boxes."""
    report = Report("bench")
    add_htp_fidelity(report, _results(), samples=4, chip=SOCS["SM8650"], output="output0")
    (table,) = report.tables
    assert table.columns == ["comparison", "SQNR dB"] and "output 'output0', no class scores" in table.title
    classifier = Report("bench")
    add_htp_fidelity(classifier, _results(), samples=4, chip=SOCS["SM8650"])
    assert "top-1 agreement" in classifier.tables[0].columns
