"""The node as its BMC reports it (Redfish or IPMI), and whether that BMC describes this host.

Re-exported by agent.core.facts, where callers import them from.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from agent.core.facts_base import NOT_READ, Maybe


class BmcBinding(NamedTuple):
    """Whether the BMC that was read describes this host (agent.policy.matching.bind_bmc).

    `state`: bound (Redfish UUID or serial equals DMI's), remote (they differ), unknown (one side has
    no usable identity), bmc_only (no host in this audit: the BMC is the node), no_bmc.
    """

    state: str
    message: str
    observed: dict[str, str | None] = {}

    @property
    def describes_node(self) -> bool:
        """The BMC's view is this node's: cross-checks may compare it with the host's."""
        return self.state in ("bound", "bmc_only")


class BmcTemperature(NamedTuple):
    """A temperature sensor with its own thresholds (°C). None: not reported."""

    name: str
    reading: float | None
    upper_caution: float | None = None
    upper_critical: float | None = None
    upper_fatal: float | None = None
    state: str | None = None  # Redfish Status.State: Enabled, Absent, ...; IPMI: present/absent
    health: str | None = None  # OK, Warning, Critical
    context: str | None = None  # PhysicalContext: Intake, CPU, GPU, ...
    where: str = ""  # the Redfish resource or IPMI sensor it came from


class BmcFan(NamedTuple):
    name: str
    reading: float | None
    units: str | None = None  # RPM or Percent
    lower_critical: float | None = None
    state: str | None = None
    health: str | None = None
    where: str = ""


class BmcVoltage(NamedTuple):
    """A voltage rail with its own thresholds (V), both ways (issue 31.2). None: not reported.

    From Redfish `Power.Voltages` (ReadingVolts, Upper/LowerThreshold{NonCritical,Critical,Fatal}), a
    `#Sensor` of ReadingType Voltage (Thresholds.{Upper,Lower}{Caution,Critical,Fatal}) or an IPMI
    voltage sensor (unc/uc/unr, lnc/lc/lnr)."""

    name: str
    reading: float | None
    lower_caution: float | None = None
    lower_critical: float | None = None
    lower_fatal: float | None = None
    upper_caution: float | None = None
    upper_critical: float | None = None
    upper_fatal: float | None = None
    state: str | None = None
    health: str | None = None
    context: str | None = None  # PhysicalContext: VoltageRegulator, CPU, PowerSupply, ...
    where: str = ""


class BmcPsu(NamedTuple):
    name: str
    state: str | None = None  # Enabled, Absent, StandbySpare, UnavailableOffline, ...
    health: str | None = None
    model: str | None = None
    firmware: str | None = None
    capacity_w: float | None = None
    output_w: float | None = None
    where: str = ""


class BmcRedundancy(NamedTuple):
    name: str
    mode: str | None = None  # N+m, Failover, ...
    state: str | None = None
    health: str | None = None
    min_needed: int | None = None
    members: int | None = None
    where: str = ""


class BmcPowerLimit(NamedTuple):
    """A power cap the BMC enforces (Power.PowerControl[].PowerLimit, or a `#Control` of type Power)."""

    name: str
    limit_w: float | None  # None: no cap set
    exception: str | None = None  # LimitException: NoAction, HardPowerOff, LogEventOnly, Oem
    capacity_w: float | None = None  # what the platform is rated for (PowerCapacityWatts, SettingRangeMax)
    consumed_w: float | None = None
    where: str = ""


class BmcLeakDetector(NamedTuple):
    name: str
    detector_state: str | None = None  # OK, Warning, Critical
    state: str | None = None
    health: str | None = None
    where: str = ""


class BiosSettings(NamedTuple):
    """Where a BMC takes BIOS changes: the `@Redfish.Settings` object of the Bios resource.

    `pending` is what the settings object holds now: on iDRAC only the staged
    changes, on iLO and others the full set the next boot will use.
    """

    bios_path: str
    settings_path: str
    apply_times: tuple[str, ...] = ()  # SupportedApplyTimes, e.g. OnReset
    pending: Maybe[dict[str, Any]] = NOT_READ
    etag: str | None = None  # of the settings object, for If-Match


class FirmwareItem(NamedTuple):
    """One entry of the firmware inventory (or what IPMI reports for the BMC)."""

    name: str
    version: str
    component_id: str = ""  # the inventory member id, e.g. "iDRAC", "BIOS", "PSU.Slot.1"
    updateable: bool | None = None
    where: str = ""
    # What the item is, for comparing like with like (never the positional id): the inventory's
    # Description (HPE puts the part family there: "MO006400KYDND", "PowerSupplies"), SoftwareId,
    # and the Model of the hardware its RelatedItem links to, when that was read.
    description: str | None = None
    software_id: str | None = None
    model: str | None = None
    state: str | None = None  # Status.State: UnavailableOffline = the BMC could not read this image
    # Which part the image runs on, for naming it: the resources its RelatedItem links to (an HGX
    # baseboard's GPU Processor), and where the vendor says the device sits (HPE: "PCI-E Slot 14").
    related: tuple[str, ...] = ()
    location: str | None = None

    @property
    def stable_id(self) -> str:
        """An id that survives updates (Dell's ids carry the version: "Installed-159-2.3.5__BIOS.Setup.1-1")."""
        ident = self.component_id or self.name
        return ident.split("__", 1)[1] if "__" in ident else ident

    @property
    def installed(self) -> bool:
        """False for the inventory's previous or staged images (Dell: "Previous-…", "Available-…")."""
        return not (self.component_id or "").startswith(("Previous-", "Available-"))


class BmcLogEntry(NamedTuple):
    log: str  # SEL, IML, Event, ...
    entry_id: str
    severity: str | None  # OK, Warning, Critical
    message: str
    created: str | None = None  # ISO timestamp as the BMC reports it
    message_id: str | None = None
    # True: resolved (Redfish Resolved, HPE Oem.Hpe.Repaired, a later clearing entry, a deassertion);
    # False: open whatever its age (Resolved false, Repaired false, an active-fault list); None: not said.
    resolved: bool | None = None
    # Set when a later entry cleared this one (a `...Cleared` / deassertion): its time, and what it names (the
    # clearing entry's MessageArgs or IPMI sensor), so a fault the BMC clears by itself can be seen recurring.
    cleared_at: str | None = None
    about: str | None = None


class BmcGpu(NamedTuple):
    """A GPU as the BMC sees it (Processors with ProcessorType GPU, HGX baseboard)."""

    name: str
    model: str | None = None
    firmware: str | None = None
    serial: str | None = None
    state: str | None = None
    health: str | None = None
    temperature_c: float | None = None
    where: str = ""
    # Which view it is (issue 13 rule 9): the ComputerSystem it is listed under, and whether that is an
    # NVIDIA HGX baseboard (`Systems/HGX_Baseboard_N`) rather than the host system. uuid and slot
    # (Location.PartLocation.ServiceLabel, e.g. "SXM3") pair the same GPU across the two views.
    system: str = ""
    baseboard: bool = False
    uuid: str | None = None
    slot: str | None = None


class BmcSwitch(NamedTuple):
    """A fabric switch the BMC manages (NVSwitch on HGX baseboards, PCIe switches)."""

    name: str
    switch_type: str | None = None  # NVLink, PCIe, MultiProtocol, ...
    model: str | None = None
    firmware: str | None = None
    state: str | None = None
    health: str | None = None
    where: str = ""


class BmcDrive(NamedTuple):
    """A drive (bay) as the BMC reports it: Systems/*/Storage/*/Drives, Chassis/*/Drives, Chassis Links.Drives.

    Each physical drive once: by resource path, then by serial number (agent.sources.redfish_storage)."""

    name: str
    slot: str  # where it sits, for the technician: PhysicalLocation / Location / the resource Id
    state: str | None = None  # Status.State: Enabled, Absent, StandbyOffline, ...
    health: str | None = None
    failure_predicted: bool | None = None  # FailurePredicted (SMART's own prediction)
    life_left_pct: float | None = None  # PredictedMediaLifeLeftPercent (SSD wear)
    media: str | None = None  # MediaType: SSD, HDD
    model: str | None = None
    serial: str | None = None
    capacity_bytes: float | None = None
    where: str = ""
    # The other resources that are this drive (a Chassis copy of a Storage drive, same serial number): a
    # volume's Links.Drives may name either.
    aliases: tuple[str, ...] = ()


class BmcVolume(NamedTuple):
    """A logical volume (RAID set) of a storage controller: Systems/*/Storage/*/Volumes."""

    name: str
    state: str | None = None
    health: str | None = None
    raid: str | None = None  # RAIDType (RAID1, RAID10, ...) or VolumeType on older schemas
    drives: tuple[str, ...] = ()  # the drive resources it is built on
    where: str = ""


class BmcFacts(NamedTuple):
    """The node as its BMC reports it. Each part may be Unknown with the resource and reason."""

    protocol: str  # redfish | ipmi
    vendor: Maybe[str] = NOT_READ
    redfish_version: Maybe[str] = NOT_READ
    manufacturer: Maybe[str] = NOT_READ
    model: Maybe[str] = NOT_READ
    bios_version: Maybe[str] = NOT_READ
    health: Maybe[str] = NOT_READ
    health_rollup: Maybe[str] = NOT_READ
    health_causes: tuple[str, ...] = ()  # what the BMC blames, when it says (Conditions, sub-resources)
    manager_model: Maybe[str] = NOT_READ
    manager_firmware: Maybe[str] = NOT_READ
    power_state: Maybe[str] = NOT_READ
    firmware: Maybe[tuple[FirmwareItem, ...]] = NOT_READ
    temperatures: Maybe[tuple[BmcTemperature, ...]] = NOT_READ
    fans: Maybe[tuple[BmcFan, ...]] = NOT_READ
    psus: Maybe[tuple[BmcPsu, ...]] = NOT_READ
    redundancy: Maybe[tuple[BmcRedundancy, ...]] = NOT_READ
    leak_detectors: Maybe[tuple[BmcLeakDetector, ...]] = NOT_READ
    power_consumed_w: Maybe[float] = NOT_READ
    bios_attributes: Maybe[dict[str, Any]] = NOT_READ
    bios_settings: Maybe[BiosSettings] = NOT_READ  # Unsupported: the BMC takes no BIOS changes over Redfish
    events: Maybe[tuple[BmcLogEntry, ...]] = NOT_READ
    gpus: Maybe[tuple[BmcGpu, ...]] = NOT_READ  # each GPU once: the HGX baseboard's view where there is one
    switches: Maybe[tuple[BmcSwitch, ...]] = NOT_READ
    problems: tuple[str, ...] = ()  # resources that failed, with the reason
    insecure: bool = False  # TLS verification was switched off (--bmc-insecure)
    requests: int = 0
    # The BIOS AttributeRegistry's enumerations, attribute -> {ValueName: ValueDisplayName}
    # (agent.sources.bios_registry); NOT_READ where the BMC offers none or it was not fetched.
    bios_registry: Maybe[dict[str, dict[str, str]]] = NOT_READ
    # The host ComputerSystem's identity (issue 13 rule 2: binding the BMC to the host it describes).
    system_uuid: Maybe[str] = NOT_READ
    system_serial: Maybe[str] = NOT_READ
    system_sku: Maybe[str] = NOT_READ  # Dell: the service tag (DMI product_serial); HPE: the product number
    # Every GPU Processor the BMC lists, in every view: the host system's own and the HGX baseboard's
    # (a GPU can appear twice); NOT_READ where the parser did not set it (then `gpus` is all there is).
    gpu_views: Maybe[tuple[BmcGpu, ...]] = NOT_READ
    # Storage (issue 22 item 7): every drive bay and volume the BMC lists, absent bays included (the check
    # skips them); NOT_READ where the parser did not set it, Unsupported where the BMC has no Storage.
    drives: Maybe[tuple[BmcDrive, ...]] = NOT_READ
    volumes: Maybe[tuple[BmcVolume, ...]] = NOT_READ
    # Sensors (the newer layout) of types no check judges, (ReadingType, count): said, never silent (31.2)
    sensors_not_judged: tuple[tuple[str, int], ...] = ()
    power_limits: Maybe[tuple[BmcPowerLimit, ...]] = NOT_READ  # issue 31.5
    voltages: Maybe[tuple[BmcVoltage, ...]] = NOT_READ  # issue 31.2
