"""The devices verb: execution providers, QNN backends and this CPU's int8 paths."""

from __future__ import annotations

from pathlib import Path

from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish


def devices(*, report_path: str | Path | None = None) -> CommandResult:
    """Probe execution providers, QNN backends, int8-relevant CPU features, cores and memory; say what npukit picks."""
    from npukit.runtime.devices import probe_devices

    probe = probe_devices()
    data = probe.as_dict()
    report = Report("devices", title="npukit devices")
    report.add("devices", data)
    report.add_table("Execution providers", ["provider", "kind"],
                     [[p, "built in"] for p in probe.providers]
                     + [[e["ep_name"], f"plugin ({e['vendor']}, {e['device']})"] for e in data["plugin_eps"]
                        if e["ep_name"] not in probe.providers])
    report.add_table("QNN backends", ["backend", "loads", "why not"],
                     [[b, reason is None, reason or ""] for b, reason in data["qnn"]["backends"].items()])
    cpu = data["cpu"]
    report.add_table("CPU", ["property", "value"],
                     [[k, ", ".join(v) if isinstance(v, list) else v] for k, v in cpu.items()]
                     + [["memory_total_bytes", probe.memory_total_bytes],
                        ["memory_available_bytes", probe.memory_available_bytes]])
    report.add_table("int8 conv paths (measured here against exact integer arithmetic)",
                     ["conv", "ORT kernel", "weights", "exact", "max steps off", "share of outputs off"],
                     [[p.name, p.kernel, p.weights, p.exact, p.steps_off, p.share_off] for p in probe.int8_paths])
    report.add_table("Plan", ["what npukit would pick"], [[line] for line in probe.plan])
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=False, json_path=json_path, result=probe)
