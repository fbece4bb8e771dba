"""The representative model-zoo subset CI runs: every model exports and its optimized graph matches torch."""

from __future__ import annotations

import pytest

from ._load import load_benchmark

zoo = load_benchmark("export_zoo")


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.CI_SUBSET)
def test_zoo_model_exports_and_matches_torch(name, tmp_path):
    row = zoo.run_model(name, tmp_path, runs=0, time_it=False)
    assert row.error is None, row.error
    assert row.export_max_rel is not None and row.export_max_rel <= zoo.RTOL
    assert row.optimized_max_rel_vs_torch <= zoo.RTOL
    assert row.optimized_max_rel_vs_export <= zoo.RTOL
    assert row.nodes_after <= row.nodes_before
    assert row.ok
    assert not list(tmp_path.iterdir()), "the zoo run cleans up its files"
