"""Issue 26.10: the fleet report a person reads. 300 nodes: the top cards, failing nodes grouped by the
checks that fail on them (with counts), and a node x GPU-slot heat map instead of ~100 thermal rows,
checked in headless Chromium at 1400 px."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

from agent.apps.fleet.heatmap import HOTTEST, WIDTH, cell_colour
from tests.conftest import RunCli
from tests.unit.apps.test_fleet import NOW, _generator, finding, fleet_of, report


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG such as Chromium writes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour, _c, _f, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    step = 3 if colour == 2 else 4
    raw, stride, rows = zlib.decompress(idat), width * step, []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - step] if i >= step else 0
            up, corner = previous[i], previous[i - step] if i >= step else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, [bytes(b for k, b in enumerate(r) if k % step < 3) for r in rows]


def test_a_300_node_fleet_reads_on_one_screen_in_chromium(run_cli: RunCli, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is missing: run `.venv/bin/python -m tests.peers.setup` (Debian package chromium)"
    reports = tmp_path / "reports"
    _generator().generate(reports, nodes=300, seed=3)
    page = tmp_path / "fleet.html"
    assert run_cli("fleet", "report", str(reports), "--format", "html", "--output", str(page), "--now", NOW).code == 0
    text = page.read_text()
    # the top cards stay; the heat map replaces the thermal rows; failing nodes come grouped with counts
    assert '<div class="cards">' in text and '<b class="">300</b><span>nodes</span>' in text
    thermal = text[text.index('<h2 id="thermal">'):text.index('<h2 id="xid">')]
    assert '<svg id="thermal-heatmap"' in thermal and "<table" not in thermal
    assert thermal.count("<rect ") == 300 * 8
    width = float(re.search(r'<svg id="thermal-heatmap"[^>]* width="([\d.]+)"', thermal).group(1))  # type: ignore[union-attr]
    assert width <= WIDTH
    worst = text[text.index('<h2 id="worst">'):text.index('<h2 id="firmware">')]
    groups = re.findall(r'<tr><td class="n">(\d+)</td>', worst)
    assert 1 < len(groups) <= 30 and int(groups[0]) > 1 and sum(map(int, groups)) == worst.count('<a href="#node-') + sum(
        int(n) for n in re.findall(r"and (\d+) more", worst))  # every failing node counted once
    shot = tmp_path / "fleet.png"
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars"]
    proc = subprocess.run([*common, f"--screenshot={shot}", "--window-size=1400,4000", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shot_width, _height, rows = png_pixels(shot.read_bytes())
    assert shot_width == 1400
    hottest = bytes(HOTTEST)
    hot_rows = [y for y, row in enumerate(rows) if row.count(hottest) >= 3]
    assert len(hot_rows) >= 16, "no heat map drawn: the hottest cells' colour is not on the page"
    # a rectangle of cells: the map's rows sit together, well within one screen's height
    assert hot_rows[-1] - hot_rows[0] < 8 * 16 + 20


def test_heat_cells_are_degrees_above_the_slot_median_and_signatures_count_nodes() -> None:
    def temps(host: str, gpu1: float, fails: tuple[str, ...] = ()) -> dict[str, Any]:
        return report(host, [finding("gpu.temperature", "gpu0", "pass", observed=40),
                             finding("gpu.temperature", "gpu1", "pass", observed=gpu1),
                             *(finding(check, "node", "fail", "critical") for check in fails)])

    fleet = fleet_of([temps("a", 41, ("gpu.xid",)), temps("b", 41, ("gpu.xid",)), temps("c", 41),
                      temps("hot", 52, ("gpu.xid", "bmc.psu"))])
    heat = fleet["thermal_heatmap"]
    assert heat["slots"] == ["gpu0", "gpu1"] and heat["nodes"] == 4
    assert heat["rows"][0] == {"node": "hot", "profile": "hgx-h100-sxm", "above_median_c": [0.0, 11.0]}
    assert cell_colour(11.0, 5.0) == "#" + bytes(HOTTEST).hex() and cell_colour(None, 5.0) != cell_colour(0.0, 5.0)
    assert [(r["checks"], r["nodes"], r["node_names"]) for r in fleet["failure_signatures"]] == [
        (["gpu.xid"], 2, ["a", "b"]), (["bmc.psu", "gpu.xid"], 1, ["hot"])]
