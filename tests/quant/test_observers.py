from __future__ import annotations

import numpy as np
import pytest

from npukit.cli import build_parser
from npukit.quant.calibration.calibrate import make_observer
from npukit.quant.calibration.observers import (OBSERVERS, EntropyObserver, MinMaxObserver, MseObserver,
                                                MultiObserver, PercentileObserver)
from npukit.quant.config import CalibrationSpec, QuantConfig, Scheme
from npukit.search.space import RecipeSpace


def _feed(observer, batches) -> None:
    for b in batches:
        observer.update(b)


def test_minmax_is_exact_and_contains_zero() -> None:
    o = MinMaxObserver()
    _feed(o, [np.array([0.5, 2.0], np.float32), np.array([1.0, 3.25], np.float32)])
    assert o.range() == (0.0, 3.25)  # zero is always representable
    s = MinMaxObserver(symmetric=True, signed=True)
    _feed(s, [np.array([-1.5, 0.25], np.float32), np.array([0.75], np.float32)])
    assert s.range() == (-1.5, 1.5)


def test_nonfinite_values_are_ignored_and_empty_observer_refuses() -> None:
    o = MinMaxObserver()
    with pytest.raises(ValueError):
        o.range()
    o.update(np.array([np.nan, -np.inf, -2.0, 1.0], np.float32))
    assert o.range() == (-2.0, 1.0)


def test_percentile_clips_outliers() -> None:
    rng = np.random.default_rng(0)
    o = PercentileObserver(percentile=99.9)
    for _ in range(5):
        o.update(rng.uniform(-1, 1, 20000).astype(np.float32))
    o.update(np.array([50.0, -40.0], np.float32))  # two outliers
    lo, hi = o.range()
    assert -1.05 < lo < -0.95 and 0.95 < hi < 1.05
    assert (o.min, o.max) == (-40.0, 50.0)


@pytest.mark.parametrize("cls", [EntropyObserver, MseObserver, PercentileObserver])
@pytest.mark.parametrize("symmetric", [False, True])
def test_histogram_methods_clip_heavy_tails(cls, symmetric: bool) -> None:
    rng = np.random.default_rng(1)
    o = cls(symmetric=symmetric, signed=symmetric)
    for _ in range(10):
        o.update(rng.standard_t(3, 50000).astype(np.float32))
    lo, hi = o.range()
    amax = max(-o.min, o.max)
    assert 2.0 < hi < 0.9 * amax
    assert o.min <= lo < 0
    assert lo == -hi or not symmetric


@pytest.mark.parametrize("cls", [EntropyObserver, MseObserver])
def test_one_sided_relu_data_keeps_most_of_the_range(cls) -> None:
    """ReLU outputs: the zero spike must not drag the threshold down (it is counted apart)."""
    rng = np.random.default_rng(2)
    o = cls()
    for _ in range(10):
        o.update(np.maximum(rng.standard_normal(50000), 0).astype(np.float32))
    lo, hi = o.range()
    assert lo == 0.0 and 3.0 < hi <= o.max


def test_histogram_memory_is_bounded_and_rebinning_keeps_counts() -> None:
    rng = np.random.default_rng(3)
    o = PercentileObserver(num_bins=256)
    total = 0
    for k in range(300):
        x = (rng.standard_normal(1000) * (1 + k)).astype(np.float32)  # the range keeps growing
        o.update(x)
        total += x.size
    assert o.counts.size == 512
    assert int(o.counts.sum()) + o.zeros == total
    assert o.bound >= max(-o.min, o.max)


def test_make_observer_follows_config() -> None:
    assert isinstance(make_observer(QuantConfig(calibration=CalibrationSpec(method="entropy"))), EntropyObserver)
    o = make_observer(QuantConfig(scheme=Scheme(symmetric_activations=True, activation_dtype="int8"),
                                  calibration=CalibrationSpec(method="mse")), bits=16)
    assert isinstance(o, MseObserver) and o.bits == 16 and o.symmetric and o.signed


def test_the_registry_is_the_one_list_of_methods() -> None:
    """A method added to OBSERVERS is taken by the config, the CLI, the recipe search and auto's shared histogram."""
    names = list(OBSERVERS)
    assert names == ["minmax", "percentile", "entropy", "mse"]
    args = build_parser().parse_args(["quantize", "m.onnx", "--calib", "c", "-o", "o.onnx", "--method", names[-1]])
    assert args.method == names[-1]
    assert list(RecipeSpace("quick").method) == ["auto", *names]
    multi = MultiObserver(num_bins=256)
    multi.update(np.random.default_rng(0).standard_normal(10_000))
    assert list(multi.ranges()) == names
    for name, kind in OBSERVERS.items():
        assert isinstance(make_observer(QuantConfig(calibration=CalibrationSpec(method=name))), kind)
        assert type(multi.as_method(name)) is kind
    with pytest.raises(Exception, match="unknown calibration method 'kl'"):
        QuantConfig(calibration=CalibrationSpec(method="kl"))
