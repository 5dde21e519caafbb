"""Node baselines: the idle readings a node gave when it arrived, for later audits to compare with.

`nodewarden baseline record` reads the GPUs (NVML) and the BMC once and writes
`baseline.json` (`nodewarden.baseline/v1`): per GPU its idle power,
temperatures and current clocks, keyed by index but identified by UUID and
serial (a swapped GPU is recognised as such), and the BMC's temperature
sensors, fans and PSU power. It refuses while a GPU is busy, since readings
under load are no baseline. `baseline show` prints a recorded file.

Where a node's baseline lives: `<config.state_dir>/baseline.json` on a live
node, `DIR/baseline.json` for a snapshot DIR (`--snapshot`, `--simulate`).
The reader (`agent.sources.baseline`) loads it into `NodeFacts.baseline` for
the audit and the daemon; the check `baseline.drift` compares (checks/baseline_drift.py).
"""

from __future__ import annotations

import datetime as dt
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import click

from agent.apps.cli.options import source_options
from agent.core.errors import EXIT_FAIL
from agent.sources.baseline import (  # re-exported: the file format lives in the reader
    BASELINE_SCHEMA,
    BaselineError,
    baseline_path,
    parse_baseline,
    read_document,
)
from agent.state.layout import BASELINE_FILE

# agent.apps.cli.main imports this module for its command group: what `nodewarden --version` need not load
# (facts, engine, sources) is imported inside the functions.
if TYPE_CHECKING:
    from agent.core.facts import BmcFacts, GpuFacts, NvmlFacts
    from agent.core.model import Unknown
    from agent.engine.audit import AuditRequest
    from agent.policy.profiles import ProfileStore
    from agent.sources.node import NodeSource

F = TypeVar("F", bound=Callable[..., Any])


# --- recording --------------------------------------------------------------------------------


class Recording(NamedTuple):
    """A baseline document, and why it should not be trusted as one (busy GPUs)."""

    doc: dict[str, Any]
    busy: list[str]  # one line per GPU that is not (provably) idle
    notes: list[str]  # what could not be recorded
    missing: list[str] = []  # one line per GPU the node has but NVML could not read (lost, or PCI-only)


def _known(value: Any) -> Any:
    from agent.core.model import Unknown

    return None if isinstance(value, Unknown) else value


def gpu_entry(gpu: GpuFacts) -> dict[str, Any]:
    """One GPU's idle readings (null where NVML could not tell)."""
    if gpu.lost is not None:
        return {"uuid": None, "serial": None, "lost": gpu.lost}
    return {
        "uuid": _known(gpu.uuid), "serial": _known(gpu.serial), "name": _known(gpu.name),
        "pci_bus_id": _known(gpu.pci_bus_id), "power_w": _known(gpu.power_w),
        "temperature_c": _known(gpu.temperature_c), "memory_temperature_c": _known(gpu.memory_temperature_c),
        "sm_clock_mhz": _known(gpu.sm_clock_mhz), "memory_clock_mhz": _known(gpu.memory_clock_mhz),
        "utilization_gpu_pct": _known(gpu.utilization_gpu_pct),
    }


def bmc_entry(bmc: BmcFacts, notes: list[str]) -> dict[str, Any]:
    """The BMC's sensor readings, by name (sorted, so the file does not depend on read order)."""
    from agent.core.model import Unknown

    temperatures: dict[str, float] = {}
    fans: dict[str, dict[str, Any]] = {}
    psus: dict[str, float] = {}
    if isinstance(bmc.temperatures, Unknown):
        notes.append(f"BMC temperatures: {bmc.temperatures.reason}")
    else:
        for t in bmc.temperatures:
            if t.reading is not None and t.state != "Absent":
                temperatures.setdefault(t.name, float(t.reading))
    if isinstance(bmc.fans, Unknown):
        notes.append(f"BMC fans: {bmc.fans.reason}")
    else:
        for fan in bmc.fans:
            if fan.reading is not None and fan.state != "Absent":
                fans.setdefault(fan.name, {"reading": float(fan.reading), "units": fan.units})
    if isinstance(bmc.psus, Unknown):
        notes.append(f"BMC power supplies: {bmc.psus.reason}")
    else:
        for psu in bmc.psus:
            if psu.output_w is not None:
                psus.setdefault(psu.name, float(psu.output_w))
    return {
        "protocol": bmc.protocol,
        "temperatures_c": dict(sorted(temperatures.items())),
        "fans": dict(sorted(fans.items())),
        "psu_output_w": dict(sorted(psus.items())),
        "power_consumed_w": _known(bmc.power_consumed_w),
    }


def busy_reasons(nvml: NvmlFacts) -> list[str]:
    """One line per GPU that is busy, or whose idleness cannot be shown (lost GPUs are not busy)."""
    from agent.core.facts import gpu_activity
    from agent.core.model import Unknown

    reasons = []
    for gpu in nvml.gpus:
        if gpu.lost is not None:
            continue
        activity = gpu_activity(gpu)
        if isinstance(activity, Unknown):
            reasons.append(f"{gpu.label}: cannot tell whether it is idle: {activity.reason}")
        elif activity is not None:
            reasons.append(f"{gpu.label}: {activity}")
    return reasons


def record_baseline(request: AuditRequest, node: NodeSource | None = None, store: ProfileStore | None = None,
                    now: dt.datetime | None = None) -> Recording:
    """Read the node once (host identity, NVML, BMC) and build its baseline document.

    `recorded_at` is when the readings were taken: now, or a snapshot's `captured_at`.
    """
    from agent.core.errors import AuditError
    from agent.core.facts import BmcFacts, NvmlFacts
    from agent.core.model import Unknown, Unsupported
    from agent.engine.audit import choose_profile
    from agent.policy.profiles import ProfileStore
    from agent.sources.node import node_info, observed_at, open_node
    from agent.sources.registry import BMC, HOST, NVML
    from agent.sources.source import ReadOptions

    config = request.config
    node = node or open_node(request)
    options = ReadOptions(bmc=request.bmc, nvml_timeout_s=request.nvml_timeout_s)
    host = HOST.read(node, options)[0]  # not in the snapshot: absent, "not in this snapshot"
    notes: list[str] = []
    nvml: NvmlFacts | Unknown
    if node.captured("nvml"):
        nvml, _status = NVML.read(node, options)
        if isinstance(nvml, Unknown):
            raise AuditError(f"cannot record a baseline: NVML unavailable: {nvml.reason}")
        if nvml.incomplete:
            raise AuditError(f"cannot record a baseline: {nvml.incomplete}")
    else:
        nvml = Unsupported("not in this snapshot")
        notes.append("GPUs: not in this snapshot")
    bmc, _statuses = BMC.read(node, options)
    bmc_doc: dict[str, Any] | None = None
    if isinstance(bmc, BmcFacts):
        bmc_doc = bmc_entry(bmc, notes)
    elif isinstance(bmc, Unsupported):
        notes.append(f"BMC: not recorded ({bmc.reason}; --bmc URL or --ipmi HOST)")
    else:
        notes.append(f"BMC: not recorded ({bmc.reason})")
    store = store or ProfileStore(config.profile_dirs, config.overrides_file)
    profile = choose_profile(request, store, host, nvml)[0]
    info = node_info(host, node)
    model = info["model"] or (_known(bmc.model) if isinstance(bmc, BmcFacts) else None)
    stamp = observed_at(node, now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    busy = busy_reasons(nvml) if isinstance(nvml, NvmlFacts) else []
    gpus = {str(g.index): gpu_entry(g) for g in sorted(nvml.gpus, key=lambda g: g.index)} if isinstance(
        nvml, NvmlFacts) else {}
    missing = missing_gpus(host, nvml)
    doc: dict[str, Any] = {
        "schema": BASELINE_SCHEMA,
        "recorded_at": stamp.isoformat(timespec="seconds"),
        "node": {"hostname": info["hostname"], "model": model, "profile": profile.name},
        "forced": False,
        "notes": notes,
        "gpus": gpus,
        "bmc": bmc_doc,
    }
    return Recording(doc, busy, notes, missing)


def missing_gpus(host: Any, nvml: Any) -> list[str]:
    """GPUs the node has that NVML could not read: one NVML counts but cannot open (fallen off the bus),
    or one on PCI that NVML does not list. Positive evidence only: an unread PCI is no evidence."""
    from agent.core.facts import NvmlFacts
    from agent.core.model import Unknown
    from agent.sources.nvml_facts import normalize_bus_id

    if not isinstance(nvml, NvmlFacts):
        return []
    lines = [f"{gpu.label}: {gpu.lost}" for gpu in nvml.gpus if gpu.lost is not None]
    listed = {normalize_bus_id(g.pci_bus_id) for g in nvml.gpus if isinstance(g.pci_bus_id, str)}
    on_pci = getattr(host, "nvidia_gpus", None)
    if listed and on_pci is not None and not isinstance(on_pci, Unknown):
        pci_only = sorted(str(f.address) for f in on_pci if str(f.address).lower() not in listed)
        if pci_only and lines:  # a lost GPU has no bus id to tell it by: these may be it, or more
            lines.append(f"on PCI but not listed by NVML: {', '.join(pci_only)}"
                         f"{' (the lost GPU)' if len(pci_only) == len(lines) == 1 else ''}")
        else:
            lines += [f"GPU at {address} is on PCI but NVML does not list it" for address in pci_only]
    return lines


def baseline_text(doc: dict[str, Any]) -> str:
    import json  # here: `nodewarden --version` loads this module for its command group

    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def write_baseline(path: Path, doc: dict[str, Any]) -> None:
    """Through agent.io.fsutil's one writer: atomically, mode 0644 for a new file (it holds no secrets)."""
    from agent.io.fsutil import write_output

    write_output(path, baseline_text(doc))


# --- show -------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def render_table(doc: dict[str, Any], path: Path, width: int | None = None) -> str:
    """The baseline for a person: its title and file fitted to the terminal as the report's table is
    (agent.report.fit: words wrap, never cut), then the GPU columns and the BMC readings."""
    from agent.report.fit import wrap

    width = width or shutil.get_terminal_size((100, 24)).columns
    baseline = parse_baseline(doc, str(path))
    where = " ".join(x for x in (baseline.hostname, f"({baseline.model})" if baseline.model else None) if x)
    title = (f"baseline of {where or 'an unnamed node'}, profile {baseline.profile or '-'}, "
             f"recorded {baseline.recorded_at}" + (" with --force (GPUs were not idle)" if baseline.forced else ""))
    lines = [*wrap(title, width, indent="  "), *wrap(f"file: {path}", width, indent="  "), ""]
    header = ("GPU", "UUID", "serial", "power W", "temp C", "mem C", "SM MHz", "mem MHz", "util %")
    rows = [header]
    for gpu in baseline.gpus:
        rows.append((str(gpu.index), "lost" if gpu.lost else gpu.uuid or "-",
                     _cell(gpu.serial), _cell(gpu.power_w), _cell(gpu.temperature_c),
                     _cell(gpu.memory_temperature_c), _cell(gpu.sm_clock_mhz), _cell(gpu.memory_clock_mhz),
                     _cell(gpu.utilization_gpu_pct)))
    if baseline.gpus:
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                  for row in rows]
    else:
        lines.append("no GPUs recorded")
    bmc = doc.get("bmc")
    if isinstance(bmc, dict):
        lines += ["", f"BMC ({bmc.get('protocol') or '?'})"]
        fans = {name: f"{_cell(value.get('reading'))} {value.get('units') or ''}".rstrip()
                for name, value in (bmc.get("fans") or {}).items() if isinstance(value, dict)}
        for title, values, unit in (("temperatures", baseline.bmc_temperatures_c, " C"),
                                    ("fans", fans, ""), ("PSU output", baseline.psu_output_w, " W")):
            if not values:
                continue
            lines.append(f"  {title}")
            width = max(len(name) for name in values)
            lines += [f"    {name.ljust(width)}  {_cell(value)}{unit}" for name, value in values.items()]
        if baseline.power_consumed_w is not None:
            lines.append(f"  power consumed  {_cell(baseline.power_consumed_w)} W")
    else:
        lines += ["", "BMC: not recorded"]
    for note in doc.get("notes") or []:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


# --- command line (`nodewarden baseline ...`; agent/apps/cli/main.py adds the group) ---------------------


@click.group()
def baseline() -> None:
    """Record a node's idle readings when it arrives; `baseline.drift` compares later audits with them."""


@baseline.command("record")
@source_options
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Write here (default: <state_dir>/baseline.json, or DIR/baseline.json for --snapshot DIR).")
@click.option("--force", is_flag=True, help="Record even though a GPU is not idle (its readings are then no "
              "idle baseline) or cannot be read (the baseline is then marked incomplete).")
def baseline_record(simulate: str | None, snapshot: Path | None, config_path: Path | None, out: Path | None,
                    force: bool, **bmc: Any) -> None:
    """Record this node's idle GPU and BMC readings. Exit 0 recorded, 1 a GPU is not idle or cannot be read,
    2 bad input."""
    from agent.apps.cli.options import bmc_options, load_cli_config
    from agent.engine.audit import AuditRequest
    from agent.sources.node import open_node

    config = load_cli_config(config_path)
    request = AuditRequest(config=config, simulate=simulate, snapshot=snapshot, bmc=bmc_options(config, bmc))
    node = open_node(request)
    if out is None:
        if node.mode == "simulated":
            raise click.UsageError("a simulated node is read-only: give --out FILE")
        out = baseline_path(node, config)
        if node.snapshot is None and not out.parent.exists():
            from agent.io.fsutil import trusted_dir

            trusted_dir(out.parent, create=True)  # the default state dir, made 0700 like remediate makes it
    recording = record_baseline(request, node)
    if recording.missing and not force:
        from agent.apps.cli.support import error

        error("not recording a baseline: GPUs of this node cannot be read "
              "(a baseline of the GPUs left would pass for the whole board: fix or reseat them, or use --force "
              "to record one marked incomplete):\n" + "\n".join(f"  {line}" for line in recording.missing),
              missing=list(recording.missing))
        sys.exit(EXIT_FAIL)
    if recording.busy and not force:
        from agent.apps.cli.support import error

        error(f"not recording a baseline: {len(recording.busy)} GPU(s) not idle "
              "(idle readings need idle GPUs: drain the node, or use --force):\n"
              + "\n".join(f"  {line}" for line in recording.busy), busy=list(recording.busy))
        sys.exit(EXIT_FAIL)
    if recording.missing:
        recording.doc["incomplete"] = list(recording.missing)
        recording.doc["forced"] = True
        recording.notes.extend(f"not in this baseline: {line}" for line in recording.missing)
    if recording.busy:
        recording.doc["forced"] = True
        recording.notes.extend(f"not idle when recorded: {line}" for line in recording.busy)
    write_baseline(out, recording.doc)
    from agent.apps.cli.support import warn

    for note in recording.notes:
        warn(note)
    bmc_doc = recording.doc["bmc"] or {}
    click.echo(f"recorded the baseline of {recording.doc['node']['hostname'] or 'this node'}: "
               f"{len(recording.doc['gpus'])} GPU(s), {len(bmc_doc.get('temperatures_c') or {})} BMC temperature "
               f"sensor(s), into {out}" + (" (incomplete: GPUs it could not read are named in it)"
                                           if recording.missing else ""))


@baseline.command("show")
@click.option("--file", "file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Baseline file (default: <state_dir>/baseline.json from the config).")
@click.option("--config", "config_path", type=click.Path(path_type=Path), metavar="FILE",
              help="Config file (default /etc/nodewarden/config.yaml if present).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]),
              help="Output format (default: table on a terminal, json otherwise).")
def baseline_show(file: Path | None, config_path: Path | None, fmt: str | None) -> None:
    """Print a recorded baseline."""
    from agent.apps.cli.options import load_cli_config

    path = file if file is not None else load_cli_config(config_path).state_dir / BASELINE_FILE
    try:
        doc = read_document(path)
    except FileNotFoundError:
        raise BaselineError("no baseline recorded here (`nodewarden baseline record` writes one)",
                            path=str(path)) from None
    parse_baseline(doc, str(path))  # validate before printing anything
    fmt = fmt or ("table" if sys.stdout.isatty() else "json")
    click.echo(baseline_text(doc) if fmt == "json" else render_table(doc, path), nl=False)
