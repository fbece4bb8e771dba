from __future__ import annotations

import json

from npukit.runtime.devices import make_plan, probe_devices, read_cpu_info, read_meminfo
from npukit.runtime.qnn import QnnStatus
from tests.runtime.conftest import HAVE_QNN

X86_CPUINFO = """processor\t: 0
model name\t: Test CPU
physical id\t: 0
core id\t: 0
flags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni

processor\t: 1
model name\t: Test CPU
physical id\t: 0
core id\t: 0
flags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni

processor\t: 2
physical id\t: 0
core id\t: 1
flags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni
"""

ARM_CPUINFO = """processor\t: 0
Features\t: fp asimd evtstrm aes asimddp i8mm sve
CPU part\t: 0xd44
"""


def test_probe_structure():
    report = probe_devices()
    data = report.as_dict()
    json.dumps(data)  # serializable as is
    assert "CPUExecutionProvider" in data["providers"]
    assert data["cpu"]["logical_cores"] >= 1
    assert data["memory_total_bytes"] > data["memory_available_bytes"] > 0
    assert data["plan"] and all(isinstance(line, str) for line in data["plan"])
    assert data["qnn"]["importable"] == HAVE_QNN
    if HAVE_QNN:
        assert any(e["ep_name"] == "QNNExecutionProvider" for e in data["plugin_eps"])
        assert set(data["qnn"]["backends"]) == {"htp", "cpu"}
        assert data["plan"][0].startswith("qnn-htp") == report.qnn.available


def test_cpu_flags_x86(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(X86_CPUINFO)
    info = read_cpu_info(path)
    assert info.model == "Test CPU" and info.physical_cores == 2
    assert info.int8_features["avx512_vnni"] and info.int8_features["avx2"] and not info.int8_features["amx_int8"]
    assert info.has_int8_dot


def test_cpu_flags_arm(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(ARM_CPUINFO)
    info = read_cpu_info(path)
    assert info.int8_features == {"asimd": True, "asimddp": True, "i8mm": True, "sve": True, "sve2": False}
    no_qnn = QnnStatus(False, False, None, None, None, {}, "onnxruntime_qnn is not importable")
    plan = make_plan(no_qnn, info)
    assert len(plan) == 1 and "i8mm" in plan[0]


def test_meminfo(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       16384 kB\nMemFree:  100 kB\nMemAvailable:    8192 kB\n")
    assert read_meminfo(path) == (16384 * 1024, 8192 * 1024)
    assert read_meminfo(tmp_path / "absent") == (None, None)
