"""The devices verb's tables: execution providers, QNN backends, this CPU, its int8 conv paths and what npukit
would pick here."""

from __future__ import annotations

from typing import Any

from npukit.report.core import Report


def add_devices(report: Report, probe: Any) -> None:
    """A ``DeviceProbe`` as the JSON section and its tables."""
    data = probe.as_dict()
    report.add("devices", data)
    report.add_table("Execution providers", ["provider", "kind"],
                     [[p, "built in"] for p in probe.providers]
                     + [[e["ep_name"], f"plugin ({e['vendor']}, {e['device']})"] for e in data["plugin_eps"]
                        if e["ep_name"] not in probe.providers])
    report.add_table("QNN backends", ["backend", "loads", "why not"],
                     [[b, reason is None, reason or ""] for b, reason in data["qnn"]["backends"].items()])
    report.add_table("CPU", ["property", "value"],
                     [[k, ", ".join(v) if isinstance(v, list) else v] for k, v in data["cpu"].items()]
                     + [["memory_total_bytes", probe.memory_total_bytes],
                        ["memory_available_bytes", probe.memory_available_bytes]])
    report.add_table("int8 conv paths (measured here against exact integer arithmetic)",
                     ["conv", "ORT kernel", "weights", "exact", "max steps off", "share of outputs off"],
                     [[p.name, p.kernel, p.weights, p.exact, p.steps_off, p.share_off] for p in probe.int8_paths])
    report.add_table("Plan", ["what npukit would pick"], [[line] for line in probe.plan])
