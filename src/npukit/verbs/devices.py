"""The devices verb: execution providers, QNN backends and this CPU's int8 paths."""

from __future__ import annotations

from pathlib import Path

from npukit.report.core import Report
from npukit.report.devices import add_devices
from npukit.report.finish import CommandResult, finish


def devices(*, report_path: str | Path | None = None, html: bool = False) -> CommandResult:
    """Probe execution providers, QNN backends, int8-relevant CPU features, cores and memory; say what npukit picks.
    ``html``: the HTML report beside the JSON one at ``report_path`` (the machine has no file to write it beside)."""
    from npukit.errors import InputError
    from npukit.runtime.devices import probe_devices
    from npukit.verbs.common import check_report_path

    report_path = check_report_path(report_path)
    if html and not report_path:
        raise InputError("--html writes the HTML report beside the JSON one, and devices has no model file to put "
                         "them beside", hint="give --report PATH.json too")
    probe = probe_devices()
    report = Report("devices", title="npukit devices")
    add_devices(report, probe)
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=html, json_path=json_path, result=probe)
