"""Probe this machine: ONNX Runtime execution providers and plugin EPs, which QNN backends load, CPU features that
matter for int8 kernels, cores and memory, and the plan npukit would pick from them."""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path
from typing import Any

import onnxruntime as ort

from npukit.runtime.int8_paths import Int8Path, full_range_exact, probe_int8_paths
from npukit.runtime.qnn import QnnStatus, qnn_available

# /proc/cpuinfo flag -> what it means for int8 inference. x86 flags are under "flags", Arm ones under "Features".
X86_INT8_FLAGS = {
    "avx2": "AVX2 (256-bit integer SIMD)",
    "avx512f": "AVX-512 foundation",
    "avx512bw": "AVX-512 byte/word",
    "avx512_vnni": "AVX-512 VNNI (int8 dot products)",
    "avx_vnni": "AVX-VNNI (int8 dot products, 256-bit)",
    "amx_tile": "AMX tiles",
    "amx_int8": "AMX int8 matrix multiply",
}
ARM_INT8_FLAGS = {
    "asimd": "NEON (Advanced SIMD)",
    "asimddp": "dot product (SDOT/UDOT)",
    "i8mm": "int8 matrix multiply (SMMLA)",
    "sve": "SVE",
    "sve2": "SVE2",
}


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    machine: str
    model: str | None
    logical_cores: int | None
    physical_cores: int | None
    int8_features: dict[str, bool]  # flag -> present, over the flags of X86_INT8_FLAGS or ARM_INT8_FLAGS

    @property
    def has_int8_dot(self) -> bool:
        return any(self.int8_features.get(f) for f in ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"))


@dataclasses.dataclass(frozen=True)
class DeviceReport:
    onnxruntime_version: str
    providers: tuple[str, ...]  # ort.get_available_providers()
    plugin_eps: tuple[dict[str, str], ...]  # ep_name, vendor, device type for every ort.get_ep_devices() entry
    qnn: QnnStatus
    cpu: CpuInfo
    memory_total_bytes: int | None
    memory_available_bytes: int | None
    plan: tuple[str, ...]
    int8_paths: tuple[Int8Path, ...] = ()  # ORT's int8 conv paths, measured exact or not on this CPU

    def as_dict(self) -> dict[str, Any]:
        return {
            "onnxruntime_version": self.onnxruntime_version,
            "providers": list(self.providers),
            "plugin_eps": [dict(e) for e in self.plugin_eps],
            "qnn": self.qnn.as_dict(),
            "cpu": {**dataclasses.asdict(self.cpu), "has_int8_dot": self.cpu.has_int8_dot},
            "memory_total_bytes": self.memory_total_bytes,
            "memory_available_bytes": self.memory_available_bytes,
            "plan": list(self.plan),
            "int8_paths": [p.as_dict() for p in self.int8_paths],
        }


def probe_devices(*, proc: str | os.PathLike[str] = "/proc") -> DeviceReport:
    """Everything npukit needs to choose a target on this machine (the QNN probe takes about a second)."""
    qnn = qnn_available()  # registers the QNN plugin first, so get_ep_devices lists it
    plugin_eps = tuple({"ep_name": d.ep_name, "vendor": d.ep_vendor, "device": str(d.device.type).rsplit(".", 1)[-1]}
                       for d in ort.get_ep_devices())
    cpu = read_cpu_info(Path(proc) / "cpuinfo")
    total, available = read_meminfo(Path(proc) / "meminfo")
    paths = probe_int8_paths()
    return DeviceReport(
        onnxruntime_version=ort.__version__,
        providers=tuple(ort.get_available_providers()),
        plugin_eps=plugin_eps,
        qnn=qnn,
        cpu=cpu,
        memory_total_bytes=total,
        memory_available_bytes=available,
        plan=make_plan(qnn, cpu, paths),
        int8_paths=paths,
    )


def read_cpu_info(path: str | os.PathLike[str]) -> CpuInfo:
    """CPU model, core counts and int8-relevant feature flags from a /proc/cpuinfo-style file."""
    machine = platform.machine()
    text = Path(path).read_text(errors="replace") if Path(path).is_file() else ""
    flags: set[str] = set()
    model = None
    cores: set[tuple[str, str]] = set()
    physical_id = core_id = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("flags", "Features"):
            flags.update(value.split())
        elif key in ("model name", "Hardware", "CPU part") and model is None and value:
            model = value
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            core_id = value
        elif not line.strip() and core_id is not None:
            cores.add((physical_id or "0", core_id))
            physical_id = core_id = None
    if core_id is not None:
        cores.add((physical_id or "0", core_id))
    arm = "asimd" in flags or machine.lower() in ("aarch64", "arm64")
    table = ARM_INT8_FLAGS if arm else X86_INT8_FLAGS
    features = {flag: flag in flags for flag in table}
    if not arm:  # older kernels spell it avx512vnni
        features["avx512_vnni"] = features["avx512_vnni"] or "avx512vnni" in flags
    return CpuInfo(machine=machine, model=model, logical_cores=os.cpu_count(),
                   physical_cores=len(cores) or None, int8_features=features)


def read_meminfo(path: str | os.PathLike[str]) -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes from a /proc/meminfo-style file; None where absent."""
    values: dict[str, int] = {}
    if Path(path).is_file():
        for line in Path(path).read_text(errors="replace").splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if key in ("MemTotal", "MemAvailable") and parts and parts[0].isdigit():
                values[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return values.get("MemTotal"), values.get("MemAvailable")


def make_plan(qnn: QnnStatus, cpu: CpuInfo, paths: tuple[Int8Path, ...] = ()) -> tuple[str, ...]:
    """What npukit would pick here, most preferred first, each line with the reason; ``paths`` (the measured
    ``int8_paths``) adds which weight grid and conv kernel choice the measurements allow."""
    plan = []
    if qnn.available:
        where = "emulator on x86: numerically the NPU, slowly" if cpu.machine.lower() in ("x86_64", "amd64") \
            else "on-device NPU"
        plan.append(f"qnn-htp ({where}): QDQ with uint8 activations (uint16 where a layer needs it) and symmetric "
                    "int8 per-channel weights; compile to an EPContext model per SoC")
    elif qnn.importable:
        plan.append(f"qnn-htp unavailable: {qnn.reason or qnn.backends.get('htp')}")
    features = cpu.int8_features
    if features.get("amx_int8"):
        kernel = "AMX int8"
    elif features.get("avx512_vnni") or features.get("avx_vnni"):
        kernel = "VNNI"
    elif features.get("i8mm"):
        kernel = "i8mm"
    elif features.get("asimddp"):
        kernel = "dotprod"
    else:
        kernel = None
    if kernel:
        plan.append(f"cpu int8 with {kernel}: QDQ int8 per-channel weights, uint8 activations (ORT's u8s8 kernels "
                    f"use {kernel})")
    elif features.get("avx2") or features.get("asimd"):
        plan.append("cpu int8 without int8 dot-product instructions: QDQ per-channel int8 still shrinks the model; "
                    "expect a smaller speed-up (reduce_range avoids u8s8 saturation on AVX2)")
    else:
        plan.append("cpu float32: no int8 SIMD found; quantize for size only")
    if paths:
        if full_range_exact(paths):
            plan.append("int8 conv paths measured exact with full-range weights: full 8-bit weights, and each conv "
                        "timed on ORT's two int8 conv kernels (--gemm-convs auto)")
        else:
            exact = sorted({f"{p.name} with {p.weights} weights" for p in paths if p.exact})
            plan.append("int8 convs with full-range weights measured saturating here: npukit quantizes with "
                        "reduce_range grids (exact: " + ", ".join(exact) + ") and keeps each conv on ORT's "
                        "symmetric kernel (--gemm-convs on is refused)")
    return tuple(plan)
