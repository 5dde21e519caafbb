"""Redfish source: the node as its BMC reports it, gently.

The source is three parts, each its own module; every name is importable from here as before:
* agent.sources.redfish_client: the transports (`LiveRedfish`: session login with fallback to
  basic auth, bounded HTTP, logout always; `RecordedRedfish`: a snapshot's DMTF mockup tree served
  back; `RecordingRedfish`: live, remembering every answer for `snapshot capture`), `RedfishError`,
  `valid_path`;
* agent.sources.redfish_walk: `Walk`, what to fetch and how many at a time (a cache by path, at
  most `concurrency` in flight, `$expand` probed once, an overall deadline);
* agent.sources.redfish_parse: `parse_bmc`, the facts from what the walk read (shared by all
  three transports).

This module connects and walks under one deadline (`read_redfish`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.core.facts import BmcFacts
from agent.core.model import SourceStatus, Unknown
from agent.sources.deadline import DeadlineExceeded, call_with_deadline
from agent.sources.redfish_client import (
    ROOT,
    AuthFailed,
    LiveRedfish,
    PatchResult,
    RecordedRedfish,
    RecordingRedfish,
    RedfishError,
    Transport,
    checked_path,
    describe,
    valid_path,
)
from agent.sources.redfish_parse import parse_bmc
from agent.sources.redfish_walk import (
    COLLECTION_NAMES,
    MAX_COLLECTION_MEMBERS,
    MAX_LOG_ENTRIES,
    MAX_MEMBERS_KEPT,
    MAX_RESOURCES,
    DaemonPool,
    Walk,
    children,
    expand_form,
)

__all__ = ["COLLECTION_NAMES", "MAX_COLLECTION_MEMBERS", "MAX_LOG_ENTRIES", "MAX_MEMBERS_KEPT", "MAX_RESOURCES",
           "ROOT", "SENSOR_START", "AuthFailed", "DaemonPool", "LiveRedfish", "PatchResult", "RecordedRedfish",
           "RecordingRedfish", "RedfishError", "Transport", "Walk", "expand_form", "parse_bmc", "read_redfish",
           "valid_path"]

# Private names imported from here before the split (tests); their modules now name them publicly.
_children = children
_checked_path = checked_path


# --- reading with a deadline ------------------------------------------------------------------------


SENSOR_START = (f"{ROOT}/Chassis",)  # thermal, power, fans, PSUs, leak detectors: what changes minute to minute


log = logging.getLogger("nodewarden.bmc")

PROGRESS_AFTER_S = 5.0  # a live BMC read still going after this says so, once

def read_redfish(make_transport: Callable[[], Transport], *, concurrency: int = 4, deadline_s: float = 30.0,
                 insecure: bool = False, paths: tuple[str, ...] = (ROOT,), where: str = "",
                 ) -> tuple[BmcFacts | Unknown, SourceStatus, Transport | None]:
    """Connect, walk (from `paths`: the whole service, or e.g. SENSOR_START), parse.

    Never raises; never blocks much past `deadline_s`. With `where` (a live BMC's URL), a read still
    going after PROGRESS_AFTER_S logs one progress line, and a login that never came names the URL and
    the time spent (issue 36.9: a BMC that accepts TCP and never answers looked like a hung audit).
    """
    start = time.monotonic()
    outcome: dict[str, Any] = {}
    where = _without_userinfo(where)
    progress = threading.Timer(PROGRESS_AFTER_S, lambda: log.warning(
        "still waiting for the BMC at %s: %.0f s so far (the read gives up after %g s)", where,
        time.monotonic() - start, deadline_s)) if where else None
    if progress is not None:
        progress.daemon = True
        progress.start()
    try:
        return _read(make_transport, concurrency, deadline_s, insecure, paths, where, start, outcome)
    finally:
        if progress is not None:
            progress.cancel()


def _without_userinfo(url: str) -> str:
    """The URL as it may be shown: never a user or password someone wrote into it."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "the configured BMC"
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if "@" in parts.netloc else url


def _read(make_transport: Callable[[], Transport], concurrency: int, deadline_s: float, insecure: bool,
          paths: tuple[str, ...], where: str, start: float, outcome: dict[str, Any],
          ) -> tuple[BmcFacts | Unknown, SourceStatus, Transport | None]:

    def connect() -> None:
        try:
            outcome["transport"] = make_transport()
        except AuthFailed as exc:
            outcome["auth"] = exc
        except RedfishError as exc:
            outcome["error"] = exc.reason
        except Exception as exc:  # noqa: BLE001 - anything else is reported, not raised
            outcome["error"] = describe(exc)

    try:
        call_with_deadline(connect, timeout_s=deadline_s, name="redfish-connect")
    except DeadlineExceeded:
        at = f" at {where}" if where else ""
        error = f"the BMC{at} did not answer the login within {deadline_s:g} s (gave up after " \
                f"{time.monotonic() - start:.1f} s)"
        return Unknown(error), SourceStatus("redfish", ok=False, error=error,
                                            duration_s=time.monotonic() - start), None
    if "auth" in outcome or "error" in outcome:
        error = str(outcome["auth"].reason if "auth" in outcome else outcome["error"])
        failed: dict[str, Any] = {"auth_failed": True} if "auth" in outcome else {}
        return Unknown(error), SourceStatus("redfish", ok=False, error=error, duration_s=time.monotonic() - start,
                                            detail=failed), None
    transport: Transport = outcome["transport"]
    walk = Walk(transport, concurrency=concurrency, deadline_s=max(0.1, deadline_s - (time.monotonic() - start)))
    try:
        walk.run(paths)
    finally:
        if isinstance(transport, RecordedRedfish):
            transport.close()  # local files: nothing to hang on
        else:
            closer = threading.Thread(target=transport.close, daemon=True)
            closer.start()
            closer.join(2.0)
    elapsed = time.monotonic() - start
    if walk.auth_error is not None:
        error = walk.auth_error.reason
        return Unknown(error), SourceStatus("redfish", ok=False, error=error, duration_s=elapsed,
                                            detail={"auth_failed": True, "requests": transport.requests}), transport
    if not any(path in walk.resources for path in paths):
        # The walk's own start (the service root, or /Chassis for the daemon's sensor poll) is the
        # evidence that the BMC answered; a sensor walk never asks for the root.
        first = paths[0]
        error = walk.errors[first].reason if first in walk.errors else (
            "the service root did not answer" if first == ROOT else f"{first} did not answer")
        return Unknown(error), SourceStatus("redfish", ok=False, error=error, duration_s=elapsed), transport
    facts = parse_bmc(walk, insecure=insecure)
    detail: dict[str, Any] = {"requests": transport.requests, "resources": len(walk.resources),
                              "failed_resources": len(walk.errors)}
    if hasattr(transport, "auth"):
        detail["auth"] = transport.auth
    if getattr(transport, "cleartext", False) or getattr(getattr(transport, "inner", None), "cleartext", False):
        detail["cleartext"] = True  # bmc.reachable warns: credentials went over plain HTTP
    problem: str | None = f"{len(walk.errors)} resource(s) failed" if walk.errors else None
    if walk.caps_hit:
        problem = "; ".join(filter(None, [problem, *sorted(walk.caps_hit)]))
    if walk.timed_out:
        problem = f"stopped at the {deadline_s:g} s deadline; {problem or 'some resources were not read'}"
    return facts, SourceStatus("redfish", ok=not walk.timed_out, error=problem, duration_s=elapsed,
                               detail=detail), transport
