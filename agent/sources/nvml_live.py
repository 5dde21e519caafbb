"""NVML live backend: the real binding for one audit, and the daemon's session kept between polls.

An audit initialises NVML, reads every GPU and shuts NVML down. The daemon
instead keeps one `NvmlSession`: NVML stays initialised between polls and the
reader's `StaticCache` keeps each GPU's handle and static values, so a poll
asks only what changes (<= 16 calls per GPU; benchmarks/bench_nvml_poll.py).
Like DCGM, a daemon that holds NVML open keeps the driver in use: `rmmod
nvidia` waits for `systemctl stop nodewarden`; a reload without unloading
(another driver version) is seen at the next poll and drops the cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.core.facts import NvmlFacts
from agent.core.model import SourceStatus, Unknown
from agent.sources.deadline import call_with_deadline
from agent.sources.nvml_const import DEFAULT_TIMEOUT_S
from agent.sources.nvml_facts import StaticCache, read_nvml
from agent.sources.nvml_replay import RecordedNvml


def load_live_nvml() -> Any:
    """The real binding; ImportError if nvidia-ml-py is not installed."""
    import pynvml

    return pynvml


def probe_live_nvml(timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[NvmlFacts | Unknown, SourceStatus]:
    try:
        nvml = load_live_nvml()
    except ImportError as exc:
        error = f"pynvml (nvidia-ml-py) is not installed: {exc}"
        return Unknown(error), SourceStatus("nvml", ok=False, error=error)
    return read_nvml(nvml, timeout_s)


class NvmlSession:
    """One daemon's NVML: initialised once, statics cached per GPU between polls.

    `open_backend` gives the backend for one poll: the live binding (the same
    module every time), or a snapshot's recording read again each poll (so a
    remediation written into nvml.json shows at the next poll). The cache
    belongs to the session, not the backend: recorded handles are GPU indexes.
    """

    def __init__(self, open_backend: Callable[[], Any], recorded: bool) -> None:
        self._open = open_backend
        self.recorded = recorded
        self.cache = StaticCache()
        self._backend: Any = None

    @classmethod
    def live(cls) -> NvmlSession:
        return cls(load_live_nvml, recorded=False)

    @classmethod
    def replay(cls, path: Path) -> NvmlSession:
        return cls(lambda: RecordedNvml.from_file(path), recorded=True)

    def read(self, timeout_s: float) -> tuple[NvmlFacts | Unknown, SourceStatus]:
        try:
            backend = self._open()  # a snapshot's SnapshotError goes to the poller, as for an audit
        except ImportError as exc:
            error = f"pynvml (nvidia-ml-py) is not installed: {exc}"
            return Unknown(error), SourceStatus("nvml", ok=False, error=error)
        self._backend = backend
        facts, status = read_nvml(backend, timeout_s, cache=self.cache)
        if self.recorded:
            status.detail["recorded"] = True
        return facts, status

    def gpu_event(self, pci_bus_id: str) -> bool:
        """A new Xid on this GPU: its static values are read again at the next poll."""
        return self.cache.invalidate_bus(pci_bus_id)

    def close(self, timeout_s: float = 2.0) -> None:
        """nvmlShutdown, if this session initialised NVML; bounded, since a driver can hang in it."""
        backend, self._backend = self._backend, None
        if backend is None or not self.cache.initialized:
            return
        self.cache.lost_session()
        with contextlib.suppress(Exception):  # DeadlineExceeded too: the thread is left to the driver
            call_with_deadline(backend.nvmlShutdown, timeout_s=timeout_s, name="nvml-shutdown")
