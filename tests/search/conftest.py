"""Each search test starts from empty in-process memos (``npukit.quant.memo``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _empty_memos():
    from npukit.quant import memo

    memo.clear()
    yield
    memo.clear()
