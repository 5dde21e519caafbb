"""The `nvidia-smi -q -x` XML reader: the element tree flattened into "section/sub/tag" paths per GPU."""

from __future__ import annotations

import re

from agent.core.errors import SnapshotError
from agent.sources.importers.nvidia_smi_fields import (
    MAX_DEPTH,
    VERSION_SOURCES,
    Dump,
    GpuDump,
    Value,
    neutral,
    settle_versions,
)

KNOWN_XML_VERSIONS = frozenset({10, 11, 12, 13})  # nvsmi_device_vNN.dtd, drivers 450-595 (newer: a warning)


def read_xml(text: str, name: str) -> Dump:
    """Walk `nvidia-smi -q -x` output; unknown elements are ignored, so newer DTDs import too."""
    import xml.etree.ElementTree as ET  # only the XML path needs it

    entity = re.search(r"<!ENTITY", text, re.IGNORECASE)
    if entity:
        # Entity expansion is how "billion laughs" documents blow up; nvidia-smi never declares any.
        raise SnapshotError("refusing XML that declares entities (<!ENTITY>): nvidia-smi never writes them",
                            path=name, line=text.count("\n", 0, entity.start()) + 1)
    try:
        root = ET.fromstring(text)  # noqa: S314 - entities refused above; external DTDs are never fetched
    except ET.ParseError as exc:
        raise SnapshotError(f"malformed XML (truncated or corrupted?): {exc}", path=name,
                            line=exc.position[0]) from None
    if root.tag != "nvidia_smi_log":
        raise SnapshotError(f"not an nvidia-smi -q -x dump: the XML root element is <{root.tag}>, "
                            "not <nvidia_smi_log>", path=name, line=1)
    warnings: list[str] = []
    # The version is in the DOCTYPE (nvsmi_device_v12.dtd) or, in some releases, a <dtd_version>.
    declared = re.search(r"<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+\"nvsmi_device_v(\d+)\.dtd\"", text) or \
        re.fullmatch(r"\s*v?(\d+)(?:\.\d+)*\s*", root.findtext("dtd_version") or "")
    if declared is None:
        warnings.append("the XML names no nvsmi_device DTD version: imported the elements this importer knows")
    elif int(declared.group(1)) not in KNOWN_XML_VERSIONS:
        warnings.append(f"unknown nvidia-smi XML version nvsmi_device_v{declared.group(1)}.dtd: "
                        "imported the elements this importer knows")
    top: dict[str, Value] = {}
    versions = [tag for sources in VERSION_SOURCES.values() for _, tag in sources]
    for key, tag in (("timestamp", "timestamp"), ("attached", "attached_gpus"), *((tag, tag) for tag in versions)):
        found = root.find(tag)
        if found is not None and (found.text or "").strip():
            top[key] = Value((found.text or "").strip())
    settle_versions(top, "xml")  # <kmd_version> before <driver_version>, each without "[Deprecated; ...]"
    gpus: list[GpuDump] = []
    for index, element in enumerate(root.findall("gpu")):
        flat: dict[str, Value] = {}
        pending = [(child.tag, 1, child) for child in reversed(list(element))]
        while pending:
            path, depth, current = pending.pop()
            if path not in flat:
                flat[path] = Value((current.text or "").strip())
            if depth < MAX_DEPTH:
                pending.extend((f"{path}/{child.tag}", depth + 1, child) for child in reversed(list(current)))
        label = element.get("id") or flat.get("pci/pci_bus_id", Value(f"#{index}")).text
        gpu = neutral(label, None, flat, "xml")
        if not gpu.values:
            raise SnapshotError(f"GPU {label}: none of the elements this importer reads are present "
                                "(an nvidia-smi XML schema it does not know?)", path=name)
        gpus.append(gpu)
    if "attached" not in top:
        raise SnapshotError("not an nvidia-smi -q -x dump: no <attached_gpus> element", path=name)
    try:
        attached = int(top["attached"].text)
    except ValueError:
        raise SnapshotError(f"<attached_gpus> is not a number: {top['attached'].text!r}", path=name) from None
    if attached != len(gpus):
        # Well-formed XML ends with </nvidia_smi_log>, so nvidia-smi finished: fewer <gpu> elements
        # than attached GPUs means a selection (`nvidia-smi -q -x -i 0`), not a truncation.
        warnings.append(f"dump says {attached} attached GPU{'s' if attached != 1 else ''} but holds "
                        f"{len(gpus)} <gpu> element{'s' if len(gpus) != 1 else ''} (a dump of selected GPUs, "
                        f"nvidia-smi -q -x -i?): only those are recorded")
    return Dump("xml", top, gpus, warnings)
