from __future__ import annotations

import pytest

from npukit.quant.config import QuantConfig
from npukit.quant.schemes import config_for_cpu, cpu_int8_scheme
from npukit.runtime.devices import X86_INT8_FLAGS, read_cpu_info


def _cpu(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: test cpu\nflags\t\t: {flags}\ncore id\t\t: 0\n\n")
    return read_cpu_info(path)


@pytest.mark.parametrize("flags, activation, reduce_range", [
    ("sse4_2 avx avx2 fma", "uint8", True),  # AVX2 without VNNI: saturating 16-bit pair sums
    ("avx2 avx512f avx512bw avx512_vnni", "uint8", False),
    ("avx2 avx_vnni", "uint8", False),
    ("sse2", "uint8", True),
])
def test_x86_scheme_follows_the_dot_product_instructions(tmp_path, monkeypatch, flags, activation, reduce_range):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    cpu = _cpu(tmp_path, flags)
    assert set(cpu.int8_features) >= set(X86_INT8_FLAGS)
    scheme = cpu_int8_scheme(cpu)
    assert (scheme["activation_dtype"], scheme["reduce_range"]) == (activation, reduce_range)
    assert scheme["reason"]
    config = config_for_cpu(QuantConfig(method="entropy", cle=True), cpu)
    assert config.reduce_range == reduce_range and config.method == "entropy" and config.cle


def test_arm_scheme_uses_full_range_and_signed_activations_with_i8mm(tmp_path, monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    plain = cpu_int8_scheme(_cpu(tmp_path, "fp asimd asimddp"))
    assert plain["activation_dtype"] == "uint8" and not plain["reduce_range"]
    assert cpu_int8_scheme(_cpu(tmp_path, "fp asimd asimddp i8mm"))["activation_dtype"] == "int8"
