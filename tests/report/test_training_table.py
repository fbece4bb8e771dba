"""The training table's title says which epoch was kept and, where no validation samples chose it, that it is only
the last one."""

from __future__ import annotations

from types import SimpleNamespace

from npukit.report.core import Report
from npukit.quant.qat.train import Epoch
from npukit.report.qat import add_training, validation_unmoved


def _trained(start, share=None):
    epoch = Epoch(1, 0.5, 0.9, "loss", 8, 1.0, share=share)
    return SimpleNamespace(history=[epoch], steps=4, resumed_from=0, world_size=1, seconds=1.0, kept=1, start=start,
                           lowered=())


def test_the_kept_epoch_says_when_nothing_validated_it() -> None:
    unvalidated = Report("prune")
    add_training(unvalidated, _trained(None), bits=False)
    assert "no validation samples to choose on" in unvalidated.tables[-1].title
    start = Epoch(0, 0.6, 0.8, "loss", 8, 0.0, 0.6, 0.8)
    validated = Report("prune")
    add_training(validated, _trained(start), bits=False)
    assert validated.tables[-1].title.endswith("kept: epoch 1)")
    assert "substitute's share" not in validated.tables[-1].columns


def test_a_blended_substitution_shows_its_share_per_epoch() -> None:
    blended = Report("substitute")
    add_training(blended, _trained(Epoch(0, 0.6, 0.8, "loss", 8, 0.0, 0.6, 0.8, share=1.0), share=0.5), bits=False)
    table = blended.tables[-1]
    column = table.columns.index("substitute's share")
    assert [row[column] for row in table.rows] == [1.0, 0.5]


def test_a_validation_loss_that_never_moved_is_said_and_the_columns_name_the_measure() -> None:
    """ppocr_cls's two validation crops: their softmax outputs stayed on the same grid points in every epoch, so the
    start was kept without training being judged; an SQNR measure is not called agreement."""
    start = Epoch(0, 0.0872, 28.0, "SQNR dB", 8, 0.0, 0.0872, 28.0)
    flat = SimpleNamespace(history=[Epoch(1, 0.5, 27.0, "SQNR dB", 8, 1.0, 0.0872, 28.0)], steps=4, resumed_from=0,
                           world_size=1, seconds=1.0, kept=0, start=start, lowered=())
    report = Report("qat")
    add_training(report, flat, bits=True)
    assert "the validation loss did not move at all" in report.tables[-1].title
    columns = report.tables[-1].columns
    assert "SQNR dB (validation)" in columns and "agreement (validation)" not in columns
    assert validation_unmoved(flat) is not None
    moved = SimpleNamespace(**{**vars(flat), "history": [Epoch(1, 0.5, 27.0, "SQNR dB", 8, 1.0, 0.09, 27.5)]})
    assert validation_unmoved(moved) is None


def test_a_single_epoch_is_plotted_as_one_marked_point() -> None:
    """A one-epoch qat, prune or substitute run drew no loss curve in the HTML report (a line needs two points): its
    one epoch is a marker now."""
    import xml.etree.ElementTree as ET

    from npukit.report.svg import render_figure

    report = Report("substitute")
    add_training(report, _trained(None), bits=False)
    (figure,) = report.figures
    assert figure.title == "Training loss per epoch"
    assert figure.data == {"series": {"loss": {"x": [1], "y": [0.5]}}}
    root = ET.fromstring(render_figure(figure))
    assert len(root.findall(".//circle")) == 1 and not root.findall(".//path")
    assert "no data" not in [t.text for t in root.iter("text")]
