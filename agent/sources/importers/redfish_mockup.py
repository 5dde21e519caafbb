"""The `redfish-mockup` kind: a BMC's Redfish tree, as DMTF's Redfish-Mockup-Creator saves it.

Two layouts, in a folder or an archive (each file is one entry, judged on its own):

* the mockup layout: `redfish/v1/<path>/index.json` (the resource at /redfish/v1/<path>), with
  the response's `headers.json` beside it (not used by the audit: listed as skipped) and, where
  the GET failed when it was recorded, `error.txt` ("HTTP 500 ...", kept: the recorded reader
  reports that resource as the BMC answered it);
* any other JSON file holding one resource: it goes where its own `@odata.id` says.

Either way the resource lands in the snapshot's `redfish/` part exactly where a recorded BMC read
(`snapshot capture --bmc`, agent.sources.redfish.RecordingRedfish) stores it, so `audit
--snapshot` judges the BMC. Every path and `@odata.id` is hostile: each goes through the one
validator the live walker uses (agent.sources.redfish.valid_path: nothing outside /redfish/v1,
no `..` or `.` even percent-encoded, no control characters), and a file refused for its path or
its `@odata.id` is named; the rest still imports. Every body is read by the bounded JSON loader.
"""

from __future__ import annotations

import json
import posixpath
import re

from agent.io.jsonfile import load_json_bytes
from agent.sources.importers.base import Builder, Contribution, InputError, decode_text
from agent.sources.redfish import RedfishError, valid_path

MAX_RESOURCE = 32 << 20  # what agent.sources.redfish.RecordedRedfish reads of one resource
_ROOT_RE = re.compile(r"(?:^|[/:])(redfish/v1)(?=/|$)")
_VERSION_RE = re.compile(r"(?:^|[/:])redfish/index\.json$")  # /redfish: {"v1": "/redfish/v1/"}
_MOCKUP_FILES = ("index.json", "headers.json", "error.txt")


def mockup_path(name: str) -> str | None:
    """"redfish/v1/Systems/1/index.json" from an entry's name (folder or archive member), or None.

    The last `redfish/v1` in the name is the mockup's: what comes before it is the operator's folder
    or the archive's name, never part of the resource path.
    """
    matches = list(_ROOT_RE.finditer(name))
    if not matches:
        return None
    return name[matches[-1].start(1):]


def _starts_json(head: bytes) -> bool:
    return decode_text(head[:4096]).lstrip().startswith("{")


def _checked(path: str, what: str) -> str:
    try:
        clean = valid_path(path)
    except RedfishError:
        raise InputError(f"{what} {path[:160]!r} is not a Redfish resource path under /redfish/v1: refused") from None
    if any(part in _MOCKUP_FILES for part in clean.split("/")):  # a folder named index.json: a file is in the way
        raise InputError(f"{what} {path[:160]!r} names a mockup file as a folder: refused")
    return clean


class RedfishMockupImporter:
    kind = "redfish-mockup"

    def detect(self, head: bytes, name: str) -> bool:
        rel = mockup_path(name)
        leaf = posixpath.basename(rel) if rel else ""
        if leaf == "error.txt":
            return bool(re.match(r"HTTP \d{3}\b", decode_text(head[:200]).lstrip()))
        if not _starts_json(head):
            return False
        if leaf in ("index.json", "headers.json") or _VERSION_RE.search(name):
            return True
        return b'"@odata.id"' in head  # a resource saved under any name: its @odata.id says where it goes

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        name = builder.current
        rel = mockup_path(name)
        folder, leaf = posixpath.split(rel) if rel else ("", "")
        if leaf in _MOCKUP_FILES:
            uri = _checked("/" + folder, "the mockup path")
            if leaf == "headers.json":
                result.skipped.append(f"{uri}: the recorded response headers (headers.json): not used by the audit")
                return result
            if leaf == "error.txt":
                return self._error(uri, data, builder, result)
        elif _VERSION_RE.search(name):
            result.skipped.append("/redfish: the protocol version document: not used by the audit")
            return result
        else:
            uri = ""
        body = load_json_bytes(data, what=name, max_bytes=MAX_RESOURCE)
        if not isinstance(body, dict):
            raise InputError("not a JSON object: not a Redfish resource")
        odata = body.get("@odata.id")
        if odata is not None:
            if not isinstance(odata, str):
                raise InputError("its @odata.id is not a string: refused")
            own = _checked(odata, "its @odata.id")
            uri = uri or own
            if own != uri:
                result.skipped.append(f"its @odata.id is {own}: kept at {uri}, where the mockup recorded it")
        elif not uri:
            raise InputError("a JSON object without @odata.id outside a mockup's redfish/v1/<path>/index.json: "
                             "which resource it is cannot be told")
        encoded = (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()  # as RecordingRedfish writes it
        if builder.put_redfish(uri, encoded, result):
            result.contributed.append(f"redfish: {uri}")
        return result

    @staticmethod
    def _error(uri: str, data: bytes, builder: Builder, result: Contribution) -> Contribution:
        """The Mockup Creator's error.txt where a GET failed: kept beside the (absent) index.json."""
        key = uri.strip("/") + "/error.txt"
        if key in builder.redfish:
            result.skipped.append(f"{uri}: error.txt already given by an earlier input")
            return result
        builder.redfish[key] = decode_text(data[:4096]).encode("utf-8")
        if builder.current not in builder.redfish_from:
            builder.redfish_from.append(builder.current)
        result.contributed.append(f"redfish: {uri} (the error the BMC answered when recorded)")
        return result
