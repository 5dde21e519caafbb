"""Figure 10: what the safe writer and the bounded reader cost on the simulated audit.

Target (issue #12): within 3 % of the code before them.

Method: one process, one workload, two I/O layers swapped in and out run by run, interleaved
and repeated. A run is a whole `nodewarden audit --simulate hgx-h100-drifted --format json
--output FILE` done in-process (`run_audit`, `render`, the writer): ~1,500 host files, the
Redfish tree, nvml.json, the kernel log, every check, a 200 KB report written to a file.

* before: the I/O layer as it was before issue 12 (commit 814cf29), copied below: the
  snapshot reader opens `fs/<path>` with one plain `open` (links resolved the same way,
  nothing refused), JSON is `json.loads` with no size or depth scan, the report is written
  with `mkstemp` + `chmod` by path + `rename`;
* now: `SnapshotFs` (openat2 confined beneath fs/ where the kernel has it, else the
  O_NOFOLLOW component walk; type checked before and after the open; reads capped),
  `agent.io.jsonfile` (size and depth bounds), `agent.io.fsutil.write_output`.

Each run's CPU time (`process_time`: this 2-core VM shares its cores, and waiting is not
the I/O layer's cost) is compared with the `before` run of the same round; the ratio is the
median of those paired ratios. Both layers run the same checks on the same facts, so the ratio is the cost of the safety
alone. The component-walk fallback (kernels without openat2) is timed as a third variant.

Usage: python benchmarks/bench_safe_io.py [--runs 15]
"""

from __future__ import annotations

import argparse
import errno
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _timing import REPO

sys.path.insert(0, str(REPO))

import agent.sources.snapshot as snapshot_mod
from agent.engine.audit import AuditRequest, run_audit
from agent.io import jsonfile
from agent.io.fsutil import write_output
from agent.policy.config import load_config
from agent.report import render
from agent.sources.fsroot import MAX_FILE_BYTES
from agent.sources.fsroot_snapshot import SnapshotFs

NODE = "hgx-h100-drifted"


class BeforeSnapshotFs(SnapshotFs):
    """SnapshotFs's reads as they were at 814cf29: one plain open of fs/<resolved path>."""

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        cap = MAX_FILE_BYTES if limit is None else limit
        rel = self._resolve(path)
        if self.errors:
            self._raise_recorded_error(rel, path)
        try:
            fd = os.open(f"{self._base}/{rel}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
        try:
            chunks = [os.read(fd, min(cap, 65536))]
            while chunks[-1] and sum(map(len, chunks)) < cap:
                chunks.append(os.read(fd, 65536))
        finally:
            os.close(fd)
        return b"".join(chunks)[:cap]

    def open_file(self, path: str) -> int:
        return os.open(f"{self._base}/{self._resolve(path)}", os.O_RDONLY | os.O_CLOEXEC)

    def listdir(self, path: str) -> list[str]:
        rel = self._resolve(path)
        self._raise_recorded_error(rel, path)
        names: set[str] = set(self._link_children.get(rel, ()))
        try:
            names.update(n for n in os.listdir(self.base / rel) if n != ".keep")
        except FileNotFoundError:
            if not names:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
        return sorted(names)

    def is_dir(self, path: str) -> bool:
        try:
            rel = self._resolve(path)
        except OSError:
            return False
        return rel in self._link_children or (self.base / rel).is_dir()


class WalkedSnapshotFs(SnapshotFs):
    """Today's reader on a kernel without openat2: the O_NOFOLLOW component walk."""

    def __init__(self, snapshot_dir: Path) -> None:
        super().__init__(snapshot_dir)
        self._root_fd = None


def before_json_bytes(data: bytes | str, *, what: str, max_bytes: int = 0, max_depth: int = 0) -> Any:
    return json.loads(data)


def before_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@contextmanager
def io_layer(fs_class: type[SnapshotFs], json_bytes: Callable[..., Any]) -> Iterator[None]:
    """Swap the snapshot reader and the JSON parser everywhere they were imported by name."""
    original_fs, original_json = snapshot_mod.SnapshotFs, jsonfile.load_json_bytes
    holders = [m for m in list(sys.modules.values())
               if getattr(m, "load_json_bytes", None) is original_json]
    snapshot_mod.SnapshotFs = fs_class  # type: ignore[misc]
    for module in holders:
        module.load_json_bytes = json_bytes  # type: ignore[attr-defined]
    try:
        yield
    finally:
        snapshot_mod.SnapshotFs = original_fs  # type: ignore[misc]
        for module in holders:
            module.load_json_bytes = original_json  # type: ignore[attr-defined]


def one_audit(out: Path, write: Callable[[Path, str], None]) -> float:
    start = time.process_time()
    report = run_audit(AuditRequest(config=load_config(None), simulate=NODE))
    write(out, render(report, "json"))
    return time.process_time() - start


VARIANTS: dict[str, tuple[type[SnapshotFs], Callable[..., Any], Callable[[Path, str], None]]] = {
    "before": (BeforeSnapshotFs, before_json_bytes, before_write),
    "now": (SnapshotFs, jsonfile.load_json_bytes, write_output),
    "now, no openat2": (WalkedSnapshotFs, jsonfile.load_json_bytes, write_output),
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        for fs_class, json_bytes, write in VARIANTS.values():  # warm: imports, caches
            with io_layer(fs_class, json_bytes):
                one_audit(out, write)
        order = list(VARIANTS)
        for run in range(args.runs):
            for name in order[run % len(order):] + order[:run % len(order)]:  # each goes first in turn
                fs_class, json_bytes, write = VARIANTS[name]
                gc.collect()
                with io_layer(fs_class, json_bytes):
                    samples[name].append(one_audit(out, write))
    print(f"| I/O layer | median CPU time of a simulated audit ({args.runs} runs, interleaved) | ratio |")
    print("|---|---|---|")
    for name, values in samples.items():
        paired = statistics.median(now / then for now, then in zip(values, samples["before"], strict=True))
        print(f"| {name} | {statistics.median(values) * 1000:.1f} ms | {paired:.3f} |")
    ratio = statistics.median(now / then for now, then in zip(samples["now"], samples["before"], strict=True))
    print(f"target: <= 1.03 (now {ratio:.3f})")
    return 0 if ratio <= 1.03 else 1


if __name__ == "__main__":
    raise SystemExit(main())
