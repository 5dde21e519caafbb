"""Readings of current BMCs (issue 31.2): `Chassis/{id}/Sensors` (`#Sensor`: ReadingType, Reading,
Thresholds, Status), as OpenBMC (NVIDIA HGX/GH200/GB200 BMCs, many OEM trays), HPE Cray EX and newer
iDRAC/iLO firmware lay them out, often with no `Thermal`/`Power` at all.

Read into the same facts as the legacy layout (agent.core.facts_bmc: temperatures with thresholds, fans,
voltages with thresholds both ways, power), chassis by chassis: where one chassis has both, its
Sensors win (the newer schema, and the legacy resource is generated from the same sensors on every
BMC we hold), so nothing is counted twice; a chassis with only the legacy layout keeps it. Fans:
`ThermalSubsystem/Fans` (`#Fan`) and `Thermal.Fans` describe the fans themselves; a fan speed sensor
is used only for a chassis with neither (a `#Fan`'s SpeedPercent points at the same sensor). A
reading of a type nodewarden does not judge (humidity, altitude, flow, energy, ...) is counted by
type, so the BMC's facts say what was not placed instead of staying silent.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, NamedTuple

from agent.core.facts_bmc import BmcFan, BmcTemperature, BmcVoltage
from agent.sources.redfish_fields import Problems, Res

# ReadingType -> what it becomes; everything else is "not placed"
TEMPERATURE, FAN_TYPES, POWER, VOLTAGE = "Temperature", ("Rotational", "Percent"), "Power", "Voltage"
JUDGED = frozenset({TEMPERATURE, POWER, VOLTAGE, *FAN_TYPES})
FAN_CONTEXTS = ("Fan", "Cooling")
# A sensor without ReadingType (iLO 6's "sea of sensors") is classified by its units, when it has them
BY_UNITS = {"Cel": TEMPERATURE, "RPM": "Rotational", "%": "Percent", "V": VOLTAGE, "W": POWER, "A": "Current"}


class SensorReadings(NamedTuple):
    """Per chassis (`/redfish/v1/Chassis/{id}`): its temperatures and fans from Sensors, the chassis'
    power draw where a sensor names it, and the sensors of types nodewarden does not judge."""

    temperatures: dict[str, list[BmcTemperature]]
    fans: dict[str, list[BmcFan]]
    voltages: dict[str, list[BmcVoltage]]
    chassis_power_w: dict[str, float]
    not_placed: dict[str, int]  # ReadingType -> how many sensors


def chassis_of(path: str) -> str | None:
    """`/redfish/v1/Chassis/Node0/Sensors/X` -> `/redfish/v1/Chassis/Node0` (None outside a chassis)."""
    parts = path.split("/")
    return "/".join(parts[:5]) if len(parts) > 4 and parts[3] == "Chassis" else None


def _threshold(sensor: Res, name: str) -> float | None:
    return sensor.obj("Thresholds").obj(name).num("Reading")


def _temperature(sensor: Res) -> BmcTemperature:
    state, health, _ = sensor.status()
    return BmcTemperature(name=sensor.name("Name", "Id"), reading=sensor.num("Reading"),
                          upper_caution=_threshold(sensor, "UpperCaution"),
                          upper_critical=_threshold(sensor, "UpperCritical"),
                          upper_fatal=_threshold(sensor, "UpperFatal"), state=state, health=health,
                          context=sensor.text("PhysicalContext"), where=sensor.path)


def _fan(sensor: Res, kind: str) -> BmcFan:
    state, health, _ = sensor.status()
    return BmcFan(name=sensor.name("Name", "Id"), reading=sensor.num("Reading"),
                  units="RPM" if kind == "Rotational" else "Percent",
                  lower_critical=_threshold(sensor, "LowerCritical"), state=state, health=health, where=sensor.path)


def _voltage(sensor: Res) -> BmcVoltage:
    state, health, _ = sensor.status()
    return BmcVoltage(name=sensor.name("Name", "Id"), reading=sensor.num("Reading"),
                      lower_caution=_threshold(sensor, "LowerCaution"),
                      lower_critical=_threshold(sensor, "LowerCritical"),
                      lower_fatal=_threshold(sensor, "LowerFatal"),
                      upper_caution=_threshold(sensor, "UpperCaution"),
                      upper_critical=_threshold(sensor, "UpperCritical"),
                      upper_fatal=_threshold(sensor, "UpperFatal"), state=state, health=health,
                      context=sensor.text("PhysicalContext"), where=sensor.path)


def _is_fan(sensor: Res, kind: str) -> bool:
    # A "Percent" reading is a fan only in a fan's context (else it is a utilisation, a humidity, ...)
    return kind == "Rotational" or (kind == "Percent" and (sensor.text("PhysicalContext") or "") in FAN_CONTEXTS)


def read_sensors(sensors: Iterable[Res], legacy_chassis: frozenset[str] = frozenset()) -> SensorReadings:
    """The readings by chassis. A sensor of no type (and no units to tell it by) is counted as not placed
    only in a chassis without a legacy Thermal, whose readings then carry what it measures."""
    readings = SensorReadings({}, {}, {}, {}, {})
    for sensor in sensors:
        chassis = chassis_of(sensor.path)
        kind = sensor.text("ReadingType") or BY_UNITS.get(sensor.text("ReadingUnits") or "", "")
        if chassis is None or (not kind and chassis in legacy_chassis):
            continue
        if kind == TEMPERATURE:
            readings.temperatures.setdefault(chassis, []).append(_temperature(sensor))
        elif kind in FAN_TYPES and _is_fan(sensor, kind):
            readings.fans.setdefault(chassis, []).append(_fan(sensor, kind))
        elif kind == VOLTAGE:
            readings.voltages.setdefault(chassis, []).append(_voltage(sensor))
        elif kind == POWER and (sensor.text("PhysicalContext") or "") == "Chassis":
            value = sensor.num("Reading")
            if value is not None and chassis not in readings.chassis_power_w:
                readings.chassis_power_w[chassis] = value
        elif kind not in JUDGED:
            label = kind[:40] or "no ReadingType"
            readings.not_placed[label] = readings.not_placed.get(label, 0) + 1
    return readings


def metric_temperatures(metrics: Iterable[Res], read_sensors: Collection[str]) -> dict[str, list[BmcTemperature]]:
    """Per chassis, the temperatures its `ThermalMetrics` (TemperatureReadingsCelsius) and
    `EnvironmentMetrics` (TemperatureCelsius) excerpts give: readings without thresholds, the last
    resort of a chassis that has neither Sensors nor a legacy Thermal. An excerpt whose DataSourceUri is
    a sensor already read is that sensor: left out."""
    out: dict[str, list[BmcTemperature]] = {}
    for resource in metrics:
        chassis = chassis_of(resource.path)
        if chassis is None:
            continue
        excerpts = resource.items("TemperatureReadingsCelsius")
        single = resource.obj("TemperatureCelsius")
        if single.num("Reading") is not None:
            excerpts.append(Res(f"{resource.path}#/TemperatureCelsius", single.body, resource.problems))
        for excerpt in excerpts:
            source = excerpt.text("DataSourceUri")
            if source and source.rstrip("/") in read_sensors:
                continue
            name = excerpt.text("DeviceName") or (source or "").rstrip("/").rsplit("/", 1)[-1] or (
                f"{resource.name('Name', 'Id')} {excerpt.path.rsplit('#', 1)[-1]}")
            out.setdefault(chassis, []).append(BmcTemperature(
                name=name, reading=excerpt.num("Reading"), context=excerpt.text("PhysicalContext"),
                where=excerpt.path))
    return out


def metric_power_w(metrics: Iterable[Res]) -> dict[str, float]:
    """Per chassis, the power draw its EnvironmentMetrics (or ThermalMetrics, for the cooling) reports."""
    out: dict[str, float] = {}
    for resource in metrics:
        chassis = chassis_of(resource.path)
        value = resource.obj("PowerWatts").num("Reading")
        if chassis is not None and value is not None and "EnvironmentMetrics" in resource.path:
            out.setdefault(chassis, value)
    return out


def merged(legacy: Iterable[Any], from_sensors: Mapping[str, list[Any]], *,
           keep_legacy_of: frozenset[str] = frozenset()) -> list[Any]:
    """The legacy items of each chassis without Sensors readings (or named in `keep_legacy_of`), then
    every other chassis' Sensors readings: never the same chassis from both layouts."""
    replaced = set(from_sensors) - keep_legacy_of
    kept = [item for item in legacy if chassis_of(item.where) not in replaced]
    return kept + [item for chassis in sorted(replaced) for item in from_sensors[chassis]]


__all__ = ["Problems", "SensorReadings", "chassis_of", "merged", "metric_power_w", "metric_temperatures",
           "read_sensors"]
