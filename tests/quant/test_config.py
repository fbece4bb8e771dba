from __future__ import annotations

import pytest

from npukit.errors import InputError
from npukit.quant.config import QuantConfig


def test_defaults_are_per_channel_uint8_minmax() -> None:
    c = QuantConfig()
    assert (c.per_channel, c.symmetric_weights, c.activation_dtype, c.method) == (True, True, "uint8", "minmax")
    assert not c.activation_signed and QuantConfig(activation_dtype="int8").activation_signed


@pytest.mark.parametrize("kwargs", [
    {"method": "kl"}, {"activation_dtype": "int4"}, {"percentile": 40.0}, {"percentile": 100.5},
    {"num_bins": 100}, {"num_bins": 2050}, {"calib_samples": 0},
    {"int16_nodes": ("a",), "exclude": ("a",)}, {"gemm_convs": True, "reduce_range": True},
])
def test_bad_values_raise_input_error(kwargs: dict) -> None:
    with pytest.raises(InputError):
        QuantConfig(**kwargs)


def test_lists_become_tuples() -> None:
    c = QuantConfig(exclude=["fc"], int16_nodes=["conv1"])
    assert c.exclude == ("fc",) and c.int16_nodes == ("conv1",)
    assert c.as_dict()["exclude"] == ("fc",)
