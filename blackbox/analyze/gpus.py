"""The supervisor's GPU history in a bundle, read as untrusted input: each GPU's last reading, idle time,
throttling and ECC errors as findings, and its series for the report. Imports the stdlib and blackbox's reader."""

from __future__ import annotations

from typing import Any

from ..bundle import layout as L
from ..bundle.reader import Bundle, number
from .model import Finding


def samples_of(history: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    """The supervisor's GPU history (index -> samples), untrusted: tables only, numbers made numbers (or None)."""
    keys = ("t", "utilization_pct", "temperature_c", "memory_used_mib", "memory_total_mib", "ecc_uncorrected")
    out = []
    for index, samples in sorted(history.items()) if isinstance(history, dict) else []:
        good = [{**x, **{k: number(x.get(k)) for k in keys}} for x in samples if isinstance(x, dict)] \
            if isinstance(samples, list) else []  # fmt: skip
        if good:
            out.append((str(index), good))
    return out


def gpu_series(bundle: Bundle) -> list[dict[str, Any]]:
    """Each GPU's utilisation and temperature over time, for the report's chart (its last 500 readings)."""
    out = []
    for index, samples in samples_of(bundle.json(L.GPU_HISTORY)):
        rows = [[x["t"], x["utilization_pct"], x["temperature_c"]] for x in samples if x["t"] is not None]
        if rows:
            out.append({"index": index, "name": str(samples[-1].get("name")), "samples": rows[-500:]})
    return out


def gpu_findings(bundle: Bundle, findings: list[Finding]) -> None:
    """From the supervisor's GPU history: each GPU's last reading, how long it sat at 0 %, and any throttling,
    heat or ECC errors seen."""
    source = L.GPU_HISTORY
    for index, samples in samples_of(bundle.json(source)):
        last = samples[-1]
        idle = 0
        for x in reversed(samples):
            if x["utilization_pct"] != 0:
                break
            idle += 1
        span = ""
        if idle > 1 and samples[-idle]["t"] is not None and last["t"] is not None:
            span = f", at 0 % for the last {last['t'] - samples[-idle]['t']:.0f} s"
        findings.append(Finding("observed", f"GPU {index} ({last.get('name')}): {last['utilization_pct']} % "
                                f"utilisation, {last['temperature_c']}C, {last['memory_used_mib']} of "
                                f"{last['memory_total_mib']} MiB{span}", source))  # fmt: skip
        throttled = {str(x["throttle"]) for x in samples if x.get("throttle")}
        if throttled:
            hottest = max(x["temperature_c"] or 0 for x in samples)
            findings.append(Finding("observed", f"GPU {index} throttled its clocks ({', '.join(sorted(throttled))}); "
                                    f"hottest reading {hottest}C", source))  # fmt: skip
        ecc = [x["ecc_uncorrected"] or 0 for x in samples]
        if ecc and max(ecc) > min(ecc):
            findings.append(Finding("observed", f"GPU {index}: uncorrected ECC errors rose from {min(ecc):g} to "
                                    f"{max(ecc):g}", source))  # fmt: skip
