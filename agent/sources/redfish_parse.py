"""The Redfish parser: the resources a walk fetched (live, recorded or replayed) -> BmcFacts.

Every field is read through `redfish_fields.Res`: a field of the wrong type is treated as not
reported and becomes a problem naming the resource (an `unknown` finding), never a crash, and
never a value a check would misjudge. Absence is kept as absence: a missing Status or reading
stays None, so the checks can tell "not reported" from "reported bad" (a critical finding needs
positive evidence). Log entries: `redfish_logs`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from agent.core.facts import (
    BiosSettings,
    BmcFacts,
    BmcFan,
    BmcGpu,
    BmcLeakDetector,
    BmcLogEntry,
    BmcPowerLimit,
    BmcPsu,
    BmcRedundancy,
    BmcSwitch,
    BmcTemperature,
    BmcVoltage,
    FirmwareItem,
)
from agent.core.model import Unknown, Unsupported
from agent.sources.bios_registry import EnumRegistry, parse_attribute_registry
from agent.sources.redfish_fields import ROOT, Problems, Res
from agent.sources.redfish_logs import entry_types, is_hardware_log, log_entries
from agent.sources.redfish_registry import name_rank, registry_id
from agent.sources.redfish_sensors import (
    SensorReadings,
    chassis_of,
    merged,
    metric_power_w,
    metric_temperatures,
    read_sensors,
)
from agent.sources.redfish_storage import parse_storage

NOT_CAUSES = ("SoftwareInventory.", "LogService.", "LogEntry.", "Collection", "Session.", "EventDestination.",
              "Certificate", "ManagerAccount.", "Role.", "Task.", "Job.", "MessageRegistry",
              "AttributeRegistry.")
CAUSE_KINDS = (("Drive.", "drive"), ("Memory.", "memory"), ("Processor.", "processor"), ("Storage.", "storage"),
               ("StorageController.", "storage controller"), ("PowerSupply.", "power supply"), ("Fan.", "fan"),
               ("Switch.", "switch"), ("NetworkAdapter.", "network adapter"), ("PCIeDevice.", "PCIe device"),
               ("ComputerSystem.", "system"), ("Chassis.", "chassis"), ("Manager.", "manager"))
EMBEDDED_CAUSES = (("PowerSupplies", "power supply"), ("Fans", "fan"), ("Temperatures", "temperature sensor"),
                   ("Redundancy", "redundancy group"))
NOT_PRESENT = ("Absent",)


class _Failure(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def reason(self) -> str: ...


class _Counter(Protocol):
    @property
    def requests(self) -> int: ...


class WalkResult(Protocol):
    """What the parser needs from a walk (agent.sources.redfish.Walk)."""

    @property
    def resources(self) -> Mapping[str, dict[str, Any]]: ...

    @property
    def errors(self) -> Mapping[str, _Failure]: ...

    @property
    def timed_out(self) -> bool: ...

    @property
    def transport(self) -> _Counter: ...


def _of_type(resources: Mapping[str, dict[str, Any]], marker: str, problems: Problems,
             collections: bool = False) -> list[Res]:
    out = []
    for path, body in sorted(resources.items()):
        kind = body.get("@odata.type")
        kind = kind if isinstance(kind, str) else ""
        if marker in kind and (collections or "Collection" not in kind):
            out.append(Res(path, body, problems))
    return out


def _lookup(resources: Mapping[str, dict[str, Any]], link: str | None) -> tuple[str, dict[str, Any]] | None:
    """The resource a link points at, matched without fragment and case (iLO links in lower case)."""
    if not link:
        return None
    clean = link.split("#", 1)[0].rstrip("/")
    if clean in resources:
        return clean, resources[clean]
    lowered = clean.lower()
    for path, body in resources.items():
        if path.lower() == lowered:
            return path, body
    return None


def _check_collections(resources: Mapping[str, dict[str, Any]], problems: Problems) -> None:
    """A collection whose Members is not a list (`"Members": 1`) is unusable: say so."""
    for path, body in sorted(resources.items()):
        if "Members" in body and body["Members"] is not None and not isinstance(body["Members"], list):
            Res(path, body, problems).items("Members")


# --- sensors, power, cooling -------------------------------------------------------------------


def _temperature(t: Res) -> BmcTemperature:
    state, health, _ = t.status()
    context = t.text("PhysicalContext")
    return BmcTemperature(
        name=t.name("Name", "MemberId"), reading=t.num("ReadingCelsius"),
        upper_caution=t.num("UpperThresholdNonCritical"), upper_critical=t.num("UpperThresholdCritical"),
        upper_fatal=t.num("UpperThresholdFatal"), state=state, health=health, context=context, where=t.path)


def _thermal(res: Mapping[str, dict[str, Any]], problems: Problems, sensors: SensorReadings
             ) -> tuple[list[BmcTemperature], list[BmcFan]]:
    temperatures: list[BmcTemperature] = []
    fans: list[BmcFan] = []
    for thermal in _of_type(res, "Thermal.", problems):
        temperatures.extend(_temperature(t) for t in thermal.items("Temperatures"))
        for f in thermal.items("Fans"):
            state, health, _ = f.status()
            fans.append(BmcFan(name=f.name("Name", "FanName", "MemberId"), reading=f.num("Reading"),
                               units=f.text("ReadingUnits"), lower_critical=f.num("LowerThresholdCritical"),
                               state=state, health=health, where=f.path))
    if not fans:  # Thermal.Fans and ThermalSubsystem/Fans describe the same fans
        for fan in _of_type(res, "Fan.", problems):
            state, health, _ = fan.status()
            fans.append(BmcFan(name=fan.name("Name", "Id"), reading=fan.obj("SpeedPercent").num("Reading"),
                               units="Percent", state=state, health=health, where=fan.path))
    # The Sensors layout (agent.sources.redfish_sensors): a chassis' temperature sensors replace its
    # Thermal.Temperatures; its fan sensors count only where the chassis describes no fan itself.
    described = frozenset(c for c in (chassis_of(f.where) for f in fans) if c)
    temperatures = merged(temperatures, sensors.temperatures)
    # ThermalMetrics / EnvironmentMetrics excerpts: only for a chassis no other layout gave a temperature
    placed = {c for c in (chassis_of(t.where) for t in temperatures) if c}
    sensor_paths = {t.where for t in temperatures}
    from_metrics = metric_temperatures(_metrics(res, problems), sensor_paths)
    temperatures += [t for chassis in sorted(set(from_metrics) - placed) for t in from_metrics[chassis]]
    return temperatures, merged(fans, sensors.fans, keep_legacy_of=described)


def _metrics(res: Mapping[str, dict[str, Any]], problems: Problems) -> list[Res]:
    """A chassis' ThermalMetrics and EnvironmentMetrics (not a GPU's: those are Processors' own)."""
    return [r for r in _of_type(res, "ThermalMetrics.", problems) + _of_type(res, "EnvironmentMetrics.", problems)
            if "/Chassis/" in r.path]


def _voltages(res: Mapping[str, dict[str, Any]], problems: Problems, sensors: SensorReadings) -> list[BmcVoltage]:
    """Power.Voltages, each chassis' replaced by its voltage Sensors where it has them (never both)."""
    rails: list[BmcVoltage] = []
    for power in _of_type(res, "Power.", problems):
        for v in power.items("Voltages"):
            state, health, _ = v.status()
            rails.append(BmcVoltage(
                name=v.name("Name", "MemberId"), reading=v.num("ReadingVolts"),
                lower_caution=v.num("LowerThresholdNonCritical"), lower_critical=v.num("LowerThresholdCritical"),
                lower_fatal=v.num("LowerThresholdFatal"), upper_caution=v.num("UpperThresholdNonCritical"),
                upper_critical=v.num("UpperThresholdCritical"), upper_fatal=v.num("UpperThresholdFatal"),
                state=state, health=health, context=v.text("PhysicalContext"), where=v.path))
    return merged(rails, sensors.voltages)


def _psu(p: Res) -> BmcPsu:
    state, health, _ = p.status()
    output = p.num("LastPowerOutputWatts")
    return BmcPsu(name=p.name("Name", "MemberId", "Id"), state=state, health=health, model=p.text("Model"),
                  firmware=p.text("FirmwareVersion"), capacity_w=p.num("PowerCapacityWatts"),
                  output_w=output if output is not None else p.num("PowerOutputWatts"), where=p.path)


def _power(res: Mapping[str, dict[str, Any]], problems: Problems
           ) -> tuple[list[BmcPsu], list[BmcRedundancy], float | None]:
    psus: list[BmcPsu] = []
    redundancy: list[BmcRedundancy] = []
    consumed: float | None = None
    for power in _of_type(res, "Power.", problems):
        psus.extend(_psu(p) for p in power.items("PowerSupplies"))
        for r in power.items("Redundancy"):
            state, health, _ = r.status()
            redundancy.append(BmcRedundancy(
                name=r.name("Name", "MemberId"), mode=r.text("Mode"), state=state, health=health,
                min_needed=r.integer("MinNumNeeded"), members=len(r.links("RedundancySet")),
                where=r.path))
        for control in power.items("PowerControl"):
            if consumed is None:
                consumed = control.num("PowerConsumedWatts")
    modern = [_psu(p) for p in _of_type(res, "PowerSupply.", problems)]
    if modern:
        psus = modern  # the same units as Power.PowerSupplies, described by the newer schema
    # PowerSubsystem/Batteries (a rack tray's or a server's backup battery): judged with the supplies
    psus += [_psu(b) for b in _of_type(res, "#Battery.", problems)]
    if not redundancy:  # the newer schema's groups only when the legacy Power has none (no doubles)
        for subsystem in _of_type(res, "PowerSubsystem.", problems):
            for number, r in enumerate(subsystem.items("PowerSupplyRedundancy")):
                state, health, _ = r.status()
                redundancy.append(BmcRedundancy(
                    name=f"PowerSupplyRedundancy {number}", mode=r.text("RedundancyType"), state=state,
                    health=health, min_needed=r.integer("MinNeededInGroup"),
                    members=len(r.links("RedundancyGroup")), where=subsystem.path))
    return psus, redundancy, consumed


def _power_limits(res: Mapping[str, dict[str, Any]], problems: Problems) -> list[BmcPowerLimit]:
    """Power caps: the legacy PowerControl's PowerLimit, and `#Control` resources of type Power (a
    disabled control caps nothing)."""
    out: list[BmcPowerLimit] = []
    for power in _of_type(res, "Power.", problems):
        for control in power.items("PowerControl"):
            limit = control.obj("PowerLimit")
            out.append(BmcPowerLimit(control.name("Name", "MemberId"), limit.num("LimitInWatts"),
                                     limit.text("LimitException"), control.num("PowerCapacityWatts"),
                                     control.num("PowerConsumedWatts"), control.path))
    for control in _of_type(res, "#Control.", problems):
        if (control.text("ControlType") or "") != "Power":
            continue
        enabled = (control.text("ControlMode") or "Automatic") not in ("Disabled", "Override")
        out.append(BmcPowerLimit(control.name("Name", "Id"), control.num("SetPoint") if enabled else None,
                                 control.text("LimitException") or control.obj("Oem").obj("Hpe").text("LimitException"),
                                 control.num("SettingRangeMax"), control.obj("Sensor").num("Reading"), control.path))
    return out


def _leaks(res: Mapping[str, dict[str, Any]], problems: Problems, errors: Mapping[str, _Failure]
           ) -> tuple[BmcLeakDetector, ...] | Unknown | None:
    """Leak detectors (LeakDetector schema) and HPE Cray leak alarms (Oem Alarms, AlarmState).

    A detector that did not answer is unknown, never dry: one unreadable Cray leak alarm makes
    the whole set unknown, naming the alarm and the BMC's answer.
    """
    out: list[BmcLeakDetector] = []
    for detector in _of_type(res, "LeakDetector.", problems):
        state, health, _ = detector.status()
        out.append(BmcLeakDetector(detector.name("Name", "Id"), detector.text("DetectorState"), state, health,
                                   detector.path))
    alarms = [a for a in _of_type(res, "Alarm.", problems) if "leak" in (a.text("Id") or a.path).lower()]
    for alarm in alarms:
        alarm_state = alarm.text("AlarmState")  # Armed: watching, dry; Triggered: leak
        detected = {"armed": "OK", "triggered": alarm.text("Severity") or "Critical"}.get((alarm_state or "").lower())
        out.append(BmcLeakDetector(alarm.name("Name", "Id"), detected, alarm_state, None, alarm.path))
    failed = [e for p, e in sorted(errors.items())
              if "/alarms" in p.lower() and ("leak" in p.lower() or p.lower().endswith("/alarms"))]
    leak_alarm_lists = [c for c in _of_type(res, "AlarmCollection", problems, True)
                        if any("leak" in link.lower() for link in c.links("Members"))]
    if failed:
        return Unknown(f"leak alarm {failed[0].path.rsplit('/', 1)[-1]} did not answer ({failed[0].reason}); "
                       f"{len(failed)} of {len(failed) + len(alarms)} leak alarm(s) unreadable: "
                       "a leak cannot be ruled out")
    if out or _of_type(res, "LeakDetection.", problems) or leak_alarm_lists:
        return tuple(out)
    return None


def _unique_names(items: list[Any]) -> list[Any]:
    """Subjects must be unique: 'HpeServerPowerSupply' x4 becomes '... #1'..'... #4'."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.name] = counts.get(item.name, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for item in items:
        if counts[item.name] > 1:
            seen[item.name] = seen.get(item.name, 0) + 1
            out.append(item._replace(name=f"{item.name} #{seen[item.name]}"))
        else:
            out.append(item)
    return out


# --- inventory, BIOS, system ---------------------------------------------------------------------


def _firmware(res: Mapping[str, dict[str, Any]], problems: Problems) -> list[FirmwareItem]:
    items = []
    for b in _of_type(res, "SoftwareInventory.", problems):
        version = b.text("Version")
        if not version:
            continue
        ident = b.text("Id") or b.path.rsplit("/", 1)[-1]
        related_models = []
        for link in b.links("RelatedItem"):
            target = _lookup(res, link)
            model = Res(target[0], target[1], problems).text("Model") if target else None
            if model:
                related_models.append(model)
        state, _health, _ = b.status()
        items.append(FirmwareItem(b.text("Name") or ident, version, component_id=ident,
                                  updateable=b.boolean("Updateable"), where=b.path,
                                  description=b.text("Description"), software_id=b.text("SoftwareId"),
                                  model=related_models[0] if related_models else None, state=state,
                                  related=tuple(b.links("RelatedItem")),
                                  location=b.obj("Oem").obj("Hpe").text("DeviceContext")))
    return items


def _current_bios(res: Mapping[str, dict[str, Any]], host: Res | None,
                  problems: Problems) -> tuple[str, dict[str, Any]] | None:
    """The host's current Bios resource. The settings object is itself a `Bios` resource, so the
    current one is the host system's `Bios` link, not just any resource of that type."""
    found = _lookup(res, host.link("Bios")) if host else None
    if found is None:
        candidates = [b for b in _of_type(res, "Bios.", problems) if b.text("Id") != "Settings"]
        found = (candidates[0].path, candidates[0].body) if candidates else None
    return found


def _bios(res: Mapping[str, dict[str, Any]], host: Res | None, problems: Problems,
          missing: Callable[[str, str], Unknown]) -> tuple[dict[str, Any] | Unknown, BiosSettings | Unknown]:
    """The current BIOS attributes and where changes to them go (the settings object)."""
    found = _current_bios(res, host, problems)
    if found is None:
        gone = missing("BIOS attributes", "/Bios")
        return gone, gone
    bios = Res(found[0], found[1], problems)
    attributes = dict(bios.obj("Attributes").body)
    settings_info = bios.obj("@Redfish.Settings")
    settings_link = settings_info.link("SettingsObject")
    if settings_link is None:
        return attributes, Unsupported("the BIOS resource has no @Redfish.Settings object: "
                                       "this BMC takes no BIOS changes over Redfish")
    settings_path = settings_link.split("#", 1)[0].rstrip("/")
    apply_times = settings_info.texts("SupportedApplyTimes")
    target = _lookup(res, settings_path)
    pending: dict[str, Any] | Unknown = (dict(Res(target[0], target[1], problems).obj("Attributes").body)
                                         if target else missing("the pending BIOS settings", settings_path))
    etag = Res(target[0], target[1], problems).text("@odata.etag") if target else None
    return attributes, BiosSettings(bios.path, target[0] if target else settings_path, apply_times, pending, etag)


class _Chain(Protocol):
    """What the parser needs from the walk's registry chain (agent.sources.redfish_registry)."""

    def registry_paths(self, wanted: str) -> list[str]: ...

    def reason(self, wanted: str) -> tuple[str, bool]: ...


def _bios_registry(res: Mapping[str, dict[str, Any]], host: Res | None, problems: Problems,
                   chain: _Chain | None) -> EnumRegistry | Unknown:
    """The enumerations of the AttributeRegistry the host's Bios names (rule 5), or why there are none.

    Only a registry reached through that Bios's chain and carrying its Id (or the same name in
    another version) is used; anything else leaves `bios.attribute` to the profile's aliases.
    """
    found = _current_bios(res, host, problems)
    wanted = registry_id(found[1]) if found else None
    if found is None or wanted is None:
        return Unsupported("the BIOS resource names no AttributeRegistry")
    read = [hit for path in (chain.registry_paths(wanted) if chain else []) if (hit := _lookup(res, path))]
    if not read:
        reason, offers_none = chain.reason(wanted) if chain else ("the registry was not read", False)
        text = f"attribute registry {wanted}: {reason}"
        return Unsupported(text) if offers_none else Unknown(text)
    why: list[str] = []
    for path, body in read:
        kind, ident = body.get("@odata.type"), body.get("Id")
        if not (isinstance(kind, str) and "AttributeRegistry." in kind):
            why.append(f"{path} is not an AttributeRegistry")
        elif not isinstance(ident, str) or name_rank(ident, wanted) not in (0, 1):
            why.append(f"{path} holds registry {str(ident)[:80]!r}, not the one the BIOS names")
        elif parsed := parse_attribute_registry(body):
            return parsed
        else:
            why.append(f"{path} lists no enumeration values")
    return Unknown(f"attribute registry {wanted}: {why[0]}")


_SYSTEM_ID = re.compile(r"^/redfish/v1/Systems/([^/]+)(?:/|$)", re.IGNORECASE)
_BASEBOARD = re.compile(r"^HGX_Baseboard(?:_\d+)?$", re.IGNORECASE)  # NVIDIA's HGX/GB200 BMC names it so


def system_of(path: str) -> str:
    """The id of the ComputerSystem a resource is listed under ("" outside /Systems)."""
    match = _SYSTEM_ID.match(path)
    return match.group(1) if match else ""


def is_baseboard(system_id: str) -> bool:
    """An NVIDIA HGX baseboard exposed as its own ComputerSystem, not the host."""
    return bool(_BASEBOARD.match(system_id))


def _pick_host_system(systems: list[Res]) -> Res | None:
    """The host computer system; HGX baseboards expose GPU trays as extra systems.

    A host that leaves BiosVersion empty is still the host: a baseboard is never picked
    while another system is listed.
    """
    hosts = [s for s in systems if not is_baseboard(system_of(s.path)) and "HGX" not in s.path]
    physical = [s for s in hosts if (s.text("SystemType") or "Physical") == "Physical" and s.text("BiosVersion")]
    chosen = physical or hosts or systems
    return chosen[0] if chosen else None


def _conditions(resource: Res) -> list[str]:
    out = []
    for condition in resource.obj("Status").items("Conditions"):
        message = condition.text("Message")
        if message:
            out.append(f"{condition.text('Severity') or '?'}: {message}")
    return out


def _kind(odata_type: str) -> str | None:
    if any(marker in odata_type for marker in NOT_CAUSES):
        return None
    return next((label for marker, label in CAUSE_KINDS if marker in odata_type), "resource")


def health_causes(system: Res, res: Mapping[str, dict[str, Any]], problems: Problems) -> tuple[str, ...]:
    """What explains a health rollup: the system's conditions, then every non-OK member read.

    Each cause names its kind (drive, memory, power supply, fan, ...). Firmware inventory images
    and log services are not hardware; absent parts are empty bays.
    """
    causes = _conditions(system)
    found: list[tuple[int, str]] = []
    for path, body in sorted(res.items()):
        resource = Res(path, body, problems)
        kind = _kind(resource.odata_type())
        if kind is None:
            continue
        state, health, _ = resource.status()
        if health in ("Warning", "Critical") and state not in NOT_PRESENT and path != system.path:
            detail = _conditions(resource)
            found.append((health != "Critical",
                          f"{kind} {resource.name('Name', 'Id', default=path)}: {health}"
                          + (f" ({detail[0].split(': ', 1)[-1]})" if detail else "")))
        for array, label in EMBEDDED_CAUSES:
            if not isinstance(body.get(array), list):
                continue
            for item in resource.items(array):
                item_state, item_health, _ = item.status()
                if item_health in ("Warning", "Critical") and item_state not in NOT_PRESENT:
                    found.append((item_health != "Critical",
                                  f"{label} {item.name('Name', 'MemberId')}: {item_health}"))
    causes.extend(text for _rank, text in sorted(found, key=lambda f: f[0]))
    return tuple(dict.fromkeys(causes))[:10]


def _events(res: Mapping[str, dict[str, Any]], problems: Problems, errors: Mapping[str, _Failure],
            missing: Callable[[str, str], Unknown]) -> tuple[BmcLogEntry, ...] | Unknown:
    """Entries of the hardware event logs; unknown when none of them could be read, never "no events"."""
    services = _of_type(res, "LogService.", problems)
    if not services:
        return missing("log services", "LogServices")
    hardware = [s for s in services if is_hardware_log(s.path.rsplit("/", 1)[-1], s.body, entry_types(res, s.path))]
    if not hardware:
        names = ", ".join(s.path.rsplit("/", 1)[-1] for s in services)
        return Unsupported(f"this BMC exposes no hardware event log (only {names})")
    entries = log_entries(res, problems)
    failed_by_path = {p.lower(): e for p, e in errors.items()}
    failed = [failed_by_path[link.lower()] for s in hardware
              if (link := s.link("Entries")) is not None and link.lower() in failed_by_path]
    if failed and len(failed) == len(hardware) and not entries:
        # The reason per resource is in the problems (bmc.reachable); this text is the same live and replayed.
        return Unknown(f"no hardware log's entries could be read ({failed[0].path}"
                       + (f" and {len(failed) - 1} more)" if len(failed) > 1 else ")"))
    return entries


def _oem_vendor(root: Res) -> str | None:
    oem = root.raw("Oem")
    return next(iter(oem)) if isinstance(oem, dict) and oem else None


# --- the whole node ------------------------------------------------------------------------------


def parse_bmc(walk: WalkResult, insecure: bool = False) -> BmcFacts:
    """Turn the resources a walk fetched into BmcFacts; missing parts say why."""
    res = walk.resources
    problems = Problems()
    _check_collections(res, problems)

    def missing(what: str, marker: str) -> Unknown:
        related = [e for p, e in walk.errors.items() if marker.lower() in p.lower()]
        if related:
            return Unknown(f"{what}: {related[0].reason} ({related[0].path})")
        if walk.timed_out:
            return Unknown(f"{what}: not read before the deadline")
        return Unsupported(f"this BMC does not expose {what}")

    root = Res(ROOT, res.get(ROOT, {}), problems)
    systems = _of_type(res, "ComputerSystem.", problems)
    managers = _of_type(res, "Manager.", problems)
    host = _pick_host_system(systems)
    facts: dict[str, Any] = {
        "vendor": root.text("Vendor") or _oem_vendor(root) or missing("the vendor", ROOT),
        "redfish_version": root.text("RedfishVersion") or missing("RedfishVersion", ROOT),
    }
    if host is not None:
        _state, health, rollup = host.status()
        facts.update(
            manufacturer=host.text("Manufacturer") or Unknown("Manufacturer is empty"),
            model=host.text("Model") or Unknown("Model is empty"),
            bios_version=host.text("BiosVersion") or Unknown("BiosVersion is empty"),
            health=health or Unknown("no Status.Health"),
            health_rollup=rollup or health or Unknown("no Status.HealthRollup"),
            health_causes=health_causes(host, res, problems),
            power_state=host.text("PowerState") or Unknown("no PowerState"),
            # Identity (issue 13 rule 2): bound to the host's DMI product_uuid / product_serial.
            system_uuid=host.text("UUID") or Unsupported("the ComputerSystem reports no UUID"),
            system_serial=host.text("SerialNumber") or Unsupported("the ComputerSystem reports no SerialNumber"),
            system_sku=host.text("SKU") or Unsupported("the ComputerSystem reports no SKU"),
        )
    else:
        gone = missing("a ComputerSystem", "/Systems")
        facts.update(manufacturer=gone, model=gone, bios_version=gone, health=gone, health_rollup=gone,
                     power_state=gone)
    if managers:
        manager = sorted(managers, key=lambda m: (m.text("ManagerType") != "BMC", m.path))[0]
        facts["manager_model"] = manager.text("Model") or Unknown("Model is empty")
        facts["manager_firmware"] = manager.text("FirmwareVersion") or Unknown("FirmwareVersion is empty")
    else:
        facts["manager_model"] = facts["manager_firmware"] = missing("a Manager", "/Managers")

    firmware = _firmware(res, problems)
    facts["firmware"] = tuple(firmware) if firmware else missing("a firmware inventory", "FirmwareInventory")
    if isinstance(facts.get("bios_version"), Unknown):
        # Some BMCs leave BiosVersion empty but list the BIOS in the inventory.
        bios = [f for f in firmware if re.search(r"\bbios\b|system rom|uefi", f.name, re.IGNORECASE)]
        if bios:
            facts["bios_version"] = bios[0].version

    legacy = frozenset(c for c in (chassis_of(t.path) for t in _of_type(res, "Thermal.", problems)) if c)
    sensors = read_sensors(_of_type(res, "#Sensor.", problems), legacy)
    temperatures, fans = _thermal(res, problems, sensors)
    psus, redundancy, consumed = _power(res, problems)
    if consumed is None and sensors.chassis_power_w:
        consumed = sensors.chassis_power_w[sorted(sensors.chassis_power_w)[0]]
    metric_power = metric_power_w(_metrics(res, problems))
    if consumed is None and metric_power:
        consumed = metric_power[sorted(metric_power)[0]]
    facts["sensors_not_judged"] = tuple(sorted(sensors.not_placed.items()))
    facts["power_limits"] = tuple(_unique_names(_power_limits(res, problems)))
    legacy_thermal = bool(_of_type(res, "Thermal.", problems) or _of_type(res, "ThermalSubsystem.", problems))
    have_thermal = legacy_thermal or bool(sensors.temperatures) or bool(temperatures)
    have_fans = legacy_thermal or bool(sensors.fans)
    have_power = bool(_of_type(res, "Power.", problems) or _of_type(res, "PowerSubsystem.", problems))
    facts["temperatures"] = tuple(_unique_names(temperatures)) if have_thermal else missing("thermal data", "Thermal")
    facts["fans"] = tuple(_unique_names(fans)) if have_fans else missing("fans", "Thermal")
    facts["psus"] = tuple(_unique_names(psus)) if have_power else missing("power supplies", "Power")
    facts["redundancy"] = tuple(redundancy) if have_power else missing("power redundancy", "Power")
    voltages = _voltages(res, problems, sensors)
    facts["voltages"] = tuple(_unique_names(voltages)) if have_power or voltages else missing("voltages", "Power")
    facts["power_consumed_w"] = consumed if consumed is not None else Unsupported("no PowerConsumedWatts")
    leaks = _leaks(res, problems, walk.errors)
    facts["leak_detectors"] = leaks if leaks is not None else missing("leak detection", "LeakDetect")

    facts["bios_attributes"], facts["bios_settings"] = _bios(res, host, problems, missing)
    if not isinstance(facts["bios_attributes"], Unknown):
        facts["bios_registry"] = _bios_registry(res, host, problems, getattr(walk, "registry", None))
    facts["events"] = _events(res, problems, walk.errors, missing)

    gpus = []
    for processor in _of_type(res, "Processor.", problems):
        if (processor.text("ProcessorType") or "").upper() == "GPU":
            state, health, _ = processor.status()
            system = system_of(processor.path)
            gpus.append(BmcGpu(name=processor.name("Name", "Id"), model=processor.text("Model"),
                               firmware=processor.text("FirmwareVersion"), serial=processor.text("SerialNumber"),
                               state=state, health=health, where=processor.path, system=system,
                               baseboard=is_baseboard(system), uuid=processor.text("UUID"),
                               slot=processor.obj("Location").obj("PartLocation").text("ServiceLabel")))
    have_processors = bool(_of_type(res, "Processor", problems, collections=True))
    # Rule 9: a GPU may be listed by the host system and by the HGX baseboard; `gpus` holds it once
    # (the baseboard's view, nearest the GPU), `gpu_views` both, for crosscheck.hgx_gpu_health.
    on_baseboard = [g for g in gpus if g.baseboard]
    facts["gpus"] = tuple(on_baseboard or gpus) if have_processors else missing("processors", "Processors")
    facts["gpu_views"] = tuple(gpus) if have_processors else facts["gpus"]
    switches = []
    for switch in _of_type(res, "Switch.", problems):
        state, health, _ = switch.status()
        switches.append(BmcSwitch(switch.name("Name", "Id"), switch.text("SwitchType"), switch.text("Model"),
                                  switch.text("FirmwareVersion"), state, health, switch.path))
    facts["switches"] = tuple(_unique_names(switches)) if _of_type(res, "Fabric.", problems) else missing(
        "fabrics", "Fabrics")
    drives, volumes, have_storage = parse_storage(res, problems)
    facts["drives"] = drives if have_storage else missing("storage", "/Storage")
    facts["volumes"] = volumes if have_storage else facts["drives"]
    walk_problems = [f"{e.path}: {e.reason}" for e in walk.errors.values()]
    return BmcFacts(protocol="redfish", problems=tuple(sorted({*walk_problems, *problems})), insecure=insecure,
                    requests=walk.transport.requests, **facts)
