"""Change kinds: how each kind of declared change is journaled, applied, verified and restored.

An actuator declares *what* to change (`remediations.AttrWrite`, `ByteWrite`, `FileEdit`,
`NvmlSet`, `RedfishPatch`); its `ChangeKind` here knows *how*, through four operations that the
remediation engine (agent.engine.remediate) calls without knowing the kind:

* `before(target, change)`: the journal state that restores the change (read before any write);
* `apply(target, change)`: the write; returns a note for the operator (a BMC job), or None;
* `verify(target, change, expectation)`: (ok, observed value) re-read through the audit's own
  parser, or None when the kind has nothing to re-read (a config file whose effect is judged
  by the next audit);
* `restore(target, state)`: put the journaled before-state back;

plus `foreign(state)`: why a journal state of this kind could not have come from nodewarden
(rollback refuses such a journal before restoring anything). The journal's `kind` field names the
kind, so a journal written by one release is restored by the same code path in the next.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from agent.core.expect import Expectation
from agent.sources.redfish import RedfishError
from agent.state.journal import b64, unb64
from remediations import AttrWrite, BmcWriter, ByteWrite, Change, FileEdit, HostTarget, NvmlSet, RedfishPatch


class VerifyError(ValueError):
    """The change cannot be re-read at all: the action is not verified, and this says why."""


class ChangeKind(Protocol):
    name: str  # the journal's "kind"
    change_type: type[Any]
    on_files: bool  # writes files on the target (an interrupted write may leave a temporary file)

    def before(self, target: HostTarget, change: Any) -> dict[str, Any]: ...

    def apply(self, target: HostTarget, change: Any) -> str | None: ...

    def verify(self, target: HostTarget, change: Any, expectation: Expectation | None) -> tuple[bool, Any] | None: ...

    def restore(self, target: HostTarget, state: dict[str, Any]) -> None: ...

    def foreign(self, state: dict[str, Any]) -> str | None: ...


# --- shared I/O helpers ------------------------------------------------------------------------------


class NotSupportedWrite(ValueError):
    """The driver refused a setter with NVML_ERROR_NOT_SUPPORTED: it changed nothing (issue 23, item 7)."""


def _nvml_call(target: HostTarget, index: int, name: str, *args: Any) -> Any:
    nvml = target.nvml()
    if nvml is None:
        raise ValueError("NVML is not available")
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        return getattr(nvml, name)(handle, *args)
    except Exception as exc:  # NVMLError, deadline: one message, no traceback
        if isinstance(exc, getattr(nvml, "NVMLError_NotSupported", ())):
            raise NotSupportedWrite(f"{name} on GPU {index} is not supported by this GPU/driver") from exc
        raise ValueError(f"{name} on GPU {index}: {exc}") from exc


def _bmc(target: HostTarget) -> BmcWriter:
    writer = target.bmc()
    if writer is None:
        raise ValueError("no BMC to write to (pass --bmc URL)")
    return writer


def _redfish_get(writer: BmcWriter, path: str, absent_ok: bool = False) -> dict[str, Any]:
    try:
        return writer.get(path)
    except RedfishError as exc:
        if absent_ok and exc.status == 404:
            return {}
        raise ValueError(str(exc)) from None


def _judged(value: Any, expectation: Expectation | None) -> tuple[bool, Any]:
    ok = value is not None and (expectation is None or expectation.evaluate(value).ok)
    return ok, value


def _file_path_problem(state: dict[str, Any]) -> str | None:
    path = state["path"]
    if path.startswith(("nvml:", "redfish:")):
        return f"{path}: not a file path"
    created = state.get("created_dirs", [])
    if not isinstance(created, list) or not all(
            isinstance(d, str) and d != "/" and path.startswith(d.rstrip("/") + "/") for d in created):
        return f"{path}: created folders outside its own path"
    return None


# --- the kinds -----------------------------------------------------------------------------------------


class AttrKind:
    """A kernel attribute (/proc/sys, /sys): the before-state is its bytes and parsed value."""

    name, change_type, on_files = "attr", AttrWrite, True

    def before(self, target: HostTarget, change: AttrWrite) -> dict[str, Any]:
        raw = target.read(change.path)
        if raw is None:
            raise FileNotFoundError(change.path)
        return {"kind": self.name, "path": change.path, "raw": b64(raw), "value": change.parse(raw)}

    def apply(self, target: HostTarget, change: AttrWrite) -> str | None:
        target.write_attr(change.path, change.value, change.shown)
        return None

    def verify(self, target: HostTarget, change: AttrWrite, expectation: Expectation | None) -> tuple[bool, Any]:
        raw = target.read(change.path)
        return _judged(None if raw is None else change.parse(raw), expectation)

    def restore(self, target: HostTarget, state: dict[str, Any]) -> None:
        raw = unb64(state["raw"])
        assert raw is not None
        target.restore_attr(str(state["path"]), raw, str(state["value"]))

    def foreign(self, state: dict[str, Any]) -> str | None:
        return _file_path_problem(state)


class BytesKind:
    """Bytes at an offset of a binary kernel file (PCI config space), as setpci writes them."""

    name, change_type, on_files = "bytes", ByteWrite, True

    def before(self, target: HostTarget, change: ByteWrite) -> dict[str, Any]:
        raw = target.read(change.path)
        end = change.offset + len(change.data)
        if raw is None:
            raise FileNotFoundError(change.path)
        if len(raw) < end:
            raise ValueError(f"{change.path}: {len(raw)} bytes readable, the write needs {end} "
                             "(config space needs root)")
        return {"kind": self.name, "path": change.path, "offset": change.offset,
                "raw": b64(raw[change.offset:end]), "value": change.parse(raw)}

    def apply(self, target: HostTarget, change: ByteWrite) -> str | None:
        target.write_at(change.path, change.offset, change.data)
        return None

    def verify(self, target: HostTarget, change: ByteWrite, expectation: Expectation | None) -> tuple[bool, Any]:
        raw = target.read(change.path)
        return _judged(None if raw is None else change.parse(raw), expectation)

    def restore(self, target: HostTarget, state: dict[str, Any]) -> None:
        old = unb64(state["raw"])
        assert old is not None
        target.write_at(str(state["path"]), int(state["offset"]), old)

    def foreign(self, state: dict[str, Any]) -> str | None:
        return _file_path_problem(state)


class FileKind:
    """A configuration file rewritten whole; folders the write creates are removed again on rollback."""

    name, change_type, on_files = "file", FileEdit, True

    def before(self, target: HostTarget, change: FileEdit) -> dict[str, Any]:
        missing: list[str] = []
        parent = os.path.dirname(change.path)
        while parent != "/" and not target.is_dir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        return {"kind": self.name, "path": change.path, "content": b64(target.read(change.path)),
                "mode": target.file_mode(change.path), "created_dirs": missing}

    def apply(self, target: HostTarget, change: FileEdit) -> str | None:
        target.write_file(change.path, change.edit(target.read(change.path)), change.mode)
        return None

    def verify(self, target: HostTarget, change: FileEdit, expectation: Expectation | None) -> None:
        return None  # its effect (a boot setting, a persisted sysctl) is what the next audit reads

    def restore(self, target: HostTarget, state: dict[str, Any]) -> None:
        mode = state.get("mode")
        target.write_file(str(state["path"]), unb64(state["content"]), int(mode) if mode is not None else 0o644)
        for directory in state.get("created_dirs", []):  # deepest first
            target.remove_empty_dir(str(directory))

    def foreign(self, state: dict[str, Any]) -> str | None:
        return _file_path_problem(state)


class NvmlKind:
    """An NVML setter on one GPU; a live GPU has no bytes to put back, so the undo is a setter call."""

    name, change_type, on_files = "nvml", NvmlSet, False

    @staticmethod
    def _read(target: HostTarget, change: NvmlSet) -> Any:
        values = [_nvml_call(target, change.index, change.getter, *args) for args in change.reads]
        return values[0] if len(values) == 1 else values

    def before(self, target: HostTarget, change: NvmlSet) -> dict[str, Any]:
        before = self._read(target, change)
        return {"kind": self.name, "path": change.path, "index": change.index, "setter": change.setter,
                "value": before, "restore_args": change.undo(before), "raw": b64(target.nvml_raw())}

    def apply(self, target: HostTarget, change: NvmlSet) -> str | None:
        _nvml_call(target, change.index, change.setter, *change.setter_args())
        target.nvml_commit()
        return None

    def verify(self, target: HostTarget, change: NvmlSet, expectation: Expectation | None) -> tuple[bool, Any]:
        try:
            value: Any = change.parse(self._read(target, change))
        except ValueError:
            value = None
        return _judged(value, expectation)

    def restore(self, target: HostTarget, state: dict[str, Any]) -> None:
        raw_nvml = unb64(state.get("raw"))
        if raw_nvml is not None and not target.live:
            target.nvml_restore_raw(raw_nvml)  # byte-exact for a recording
            return
        _nvml_call(target, int(state["index"]), str(state["setter"]), *state.get("restore_args", [state["value"]]))

    def foreign(self, state: dict[str, Any]) -> str | None:
        index, setter = state.get("index"), state.get("setter")
        if not isinstance(index, int) or isinstance(index, bool) or state["path"] != f"nvml:gpu{index}:{setter}":
            return f"{state['path']}: GPU index or setter do not match the path"
        return None


class RedfishKind:
    """BIOS attributes PATCHed into the BMC's `@Redfish.Settings` object (applied at the next boot)."""

    name, change_type, on_files = "redfish", RedfishPatch, False

    @staticmethod
    def effective(writer: BmcWriter, change: RedfishPatch) -> dict[str, Any]:
        """Each attribute's value after the next boot: pending if staged, else current."""
        current = _redfish_get(writer, change.bios_path).get("Attributes") or {}
        pending = _redfish_get(writer, change.settings_path, absent_ok=True).get("Attributes") or {}
        return {name: pending.get(name, current.get(name)) for name, _value in change.attributes}

    def before(self, target: HostTarget, change: RedfishPatch) -> dict[str, Any]:
        writer = _bmc(target)
        return {"kind": self.name, "path": change.path, "settings_path": change.settings_path,
                "values": self.effective(writer, change), "raw": b64(writer.raw(change.settings_path))}

    def apply(self, target: HostTarget, change: RedfishPatch) -> str | None:
        body: dict[str, Any] = {"Attributes": dict(change.attributes)}
        if change.apply_time:
            body["@Redfish.SettingsApplyTime"] = {"ApplyTime": change.apply_time}
        try:
            result = _bmc(target).patch(change.settings_path, body, change.etag)
        except RedfishError as exc:
            raise ValueError(str(exc)) from None
        location = getattr(result, "location", None)
        return f"the BMC queued {location}" if location else None

    def verify(self, target: HostTarget, change: RedfishPatch, expectation: Expectation | None) -> tuple[bool, Any]:
        try:
            effective = self.effective(_bmc(target), change)
        except ValueError as exc:
            raise VerifyError(f"cannot re-read the BIOS settings: {exc}") from None
        return all(effective.get(name) == value for name, value in change.attributes), effective

    def restore(self, target: HostTarget, state: dict[str, Any]) -> None:
        writer = _bmc(target)
        settings_path = str(state["settings_path"])
        if not target.live:
            writer.restore_raw(settings_path, unb64(state.get("raw")))  # byte-exact for a recording
            return
        # A live BMC has no "un-PATCH": put every attribute back to the value the next boot
        # would have used. A job the BMC queued for our PATCH is not deleted (vendor-specific).
        try:
            writer.patch(settings_path, {"Attributes": dict(state["values"])})
        except RedfishError as exc:
            raise ValueError(str(exc)) from None

    def foreign(self, state: dict[str, Any]) -> str | None:
        if state["path"] != f"redfish:{state.get('settings_path')}" or not isinstance(state.get("values"), dict):
            return f"{state['path']}: settings path or values do not match the path"
        return None


KINDS: tuple[ChangeKind, ...] = (AttrKind(), BytesKind(), FileKind(), NvmlKind(), RedfishKind())
_BY_TYPE: dict[type[Any], ChangeKind] = {kind.change_type: kind for kind in KINDS}
_BY_NAME: dict[str, ChangeKind] = {kind.name: kind for kind in KINDS}


def kind_of(change: Change) -> ChangeKind:
    """The kind that handles this change (every `remediations.Change` type has one)."""
    return _BY_TYPE[type(change)]


def kind_named(name: object) -> ChangeKind | None:
    """The kind a journal state names, or None for a kind nodewarden never wrote."""
    return _BY_NAME.get(name) if isinstance(name, str) else None
