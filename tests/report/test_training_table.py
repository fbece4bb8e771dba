"""The training table's title says which epoch was kept and, where no validation samples chose it, that it is only
the last one."""

from __future__ import annotations

from types import SimpleNamespace

from npukit.report.core import Report
from npukit.report.qat import add_training


def _trained(start):
    epoch = SimpleNamespace(epoch=1, loss=0.5, agreement=0.9, metric="loss", bits=8, seconds=1.0,
                            validation_loss=None, validation_agreement=None, as_dict=lambda: {"epoch": 1})
    return SimpleNamespace(history=[epoch], steps=4, resumed_from=0, world_size=1, seconds=1.0, kept=1, start=start)


def test_the_kept_epoch_says_when_nothing_validated_it() -> None:
    unvalidated = Report("prune")
    add_training(unvalidated, _trained(None), bits=False)
    assert "no validation samples to choose on" in unvalidated.tables[-1].title
    start = SimpleNamespace(metric="loss", bits=8, validation_loss=0.6, validation_agreement=0.8,
                            as_dict=lambda: {"epoch": 0})
    validated = Report("prune")
    add_training(validated, _trained(start), bits=False)
    assert validated.tables[-1].title.endswith("kept: epoch 1)")
