"""mitmdump addon: inject Redfish faults in front of a loopback Redfish peer (sushy-static).

Loaded by tests/peers/redfish.py (`fault_proxy`) as
    mitmdump --mode reverse:<upstream> --set connection_strategy=lazy -s redfish_fault_addon.py
It runs inside the peers venv (mitmproxy 11.0.2), never inside the project's venv.

Environment:
    NODEWARDEN_FAULT_RULES  JSON file with a list of rules, re-read on every request (the harness
                            replaces it atomically). Missing or empty file = no faults.
    NODEWARDEN_FAULT_LOG    every request is appended to it as one JSON line {"method", "path", "t"}
                            before any fault applies (so a request answered 401 is still counted).

Rule objects (tests/peers/redfish.py builds them from the short string forms):
    {"action": "latency", "seconds": s}                       every request waits s first (global)
    {"match": re, "action": "status", "code": n, "body": ..., "headers": {...}}
    {"match": re, "action": "delay", "seconds": s}            answered normally after s
    {"match": re, "action": "hang", "seconds": cap}           never answered (connection dropped after cap)
    {"match": re, "action": "reset"}                          connection dropped, no response
    {"match": re, "action": "body", "body": text}             200 with a non-JSON body
    {"match": re, "action": "missing"}                        404 with a Redfish error body
"match" is searched (re.search) in the path without its query string, unless "query": true.
The first matching rule wins; "latency" applies to every request in addition.
Waits use asyncio.sleep in an async hook, so one slow or hung path never stalls the others.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from typing import Any

from mitmproxy import http

PING_PATH = "/__faultproxy__/ping"
_REDFISH_IDS = {
    401: "Base.1.8.NoValidSession",
    403: "Base.1.8.InsufficientPrivilege",
    404: "Base.1.8.ResourceMissingAtURI",
}


def redfish_error(code: int, message: str) -> dict[str, Any]:
    message_id = _REDFISH_IDS.get(code, "Base.1.8.GeneralError")
    return {
        "error": {
            "code": message_id,
            "message": message,
            "@Message.ExtendedInfo": [
                {
                    "@odata.type": "#Message.v1_1_1.Message",
                    "MessageId": message_id,
                    "Message": message,
                    "Severity": "Critical",
                    "Resolution": "None",
                }
            ],
        }
    }


def _json_response(code: int, body: Any, headers: dict[str, str] | None = None) -> http.Response:
    content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    all_headers = {"Content-Type": "application/json", "OData-Version": "4.0"}
    all_headers.update(headers or {})
    return http.Response.make(code, content, all_headers)


class FaultInjector:
    def __init__(self) -> None:
        self.rules_path = os.environ.get("NODEWARDEN_FAULT_RULES", "")
        self.log_path = os.environ.get("NODEWARDEN_FAULT_LOG", "")

    def _rules(self) -> list[dict[str, Any]]:
        if not self.rules_path:
            return []
        try:
            with open(self.rules_path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return []
        return json.loads(text) if text.strip() else []

    def _log(self, flow: http.HTTPFlow) -> None:
        if not self.log_path:
            return
        line = json.dumps({"method": flow.request.method, "path": flow.request.path, "t": time.time()})
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    async def request(self, flow: http.HTTPFlow) -> None:
        full_path = flow.request.path
        if full_path == PING_PATH:
            flow.response = http.Response.make(200, b"faultproxy-ok", {"Content-Type": "text/plain"})
            return
        self._log(flow)
        bare_path = full_path.split("?", 1)[0]
        try:
            rules = self._rules()
        except (OSError, ValueError) as e:  # a broken rules file is a test bug: make it loud
            flow.response = _json_response(599, redfish_error(599, f"fault proxy: unreadable rules: {e}"))
            return

        latency = max((float(r["seconds"]) for r in rules if r.get("action") == "latency"), default=0.0)
        if latency > 0:
            await asyncio.sleep(latency)

        for rule in rules:
            action = rule.get("action")
            if action == "latency":
                continue
            target = full_path if rule.get("query") else bare_path
            if not re.search(rule["match"], target):
                continue
            if action == "delay":
                await asyncio.sleep(float(rule["seconds"]))  # then forwarded upstream as usual
            elif action == "hang":
                await asyncio.sleep(float(rule.get("seconds") or 120))
                if flow.killable:
                    flow.kill()
            elif action == "reset":
                flow.kill()
            elif action == "status":
                code = int(rule["code"])
                body = rule.get("body")
                if body is None:
                    body = redfish_error(code, f"injected fault: HTTP {code}")
                headers = dict(rule.get("headers") or {})
                if code == 401:
                    headers.setdefault("WWW-Authenticate", 'Basic realm="Redfish"')
                flow.response = _json_response(code, body, headers)
            elif action == "body":
                flow.response = _json_response(200, str(rule.get("body", "")))
            elif action == "missing":
                flow.response = _json_response(
                    404, redfish_error(404, f"The requested resource of type at URI '{bare_path}' was not found.")
                )
            return


addons = [FaultInjector()]
