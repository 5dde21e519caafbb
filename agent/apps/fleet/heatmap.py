"""The fleet page's thermal heat map (node x GPU slot) and its failure signatures, as HTML.

The heat map is one SVG: a column per node (hottest first), a row per GPU slot, each cell coloured
by how far the GPU runs above the fleet median of its slot and profile; 300 nodes fit one screen
at 1400 px, and every cell names its node, slot and reading on hover (<title>). Nothing is loaded
from anywhere: the page stays one self-contained file.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from agent.core.sanitise import clean

WIDTH = 1160  # the page's content width (agent.report.html CSS: max-width 1200, padding 16)
LABEL_W, CELL_H, MAX_CELL_W = 56, 16, 28
NO_READING, AT_OR_BELOW = "#eceff3", "#dde8f6"
HOTTEST = (215, 48, 31)  # #d7301f: the colour of a GPU twice the threshold or more above its slot's median
WARMEST = (255, 237, 160)  # a GPU just above the median
SIGNATURE_ROWS = 30  # failure signatures shown; the JSON has all


def _e(value: Any) -> str:
    return html.escape("" if value is None else clean(str(value)))


def cell_colour(above: float | None, delta_c: float) -> str:
    if above is None:
        return NO_READING
    if above <= 0:
        return AT_OR_BELOW
    share = min(above / (2 * delta_c), 1.0) if delta_c > 0 else 1.0
    rgb = (round(w + (h - w) * share) for w, h in zip(WARMEST, HOTTEST, strict=True))
    return "#" + "".join(f"{c:02x}" for c in rgb)


def heatmap_svg(heatmap: dict[str, Any], link: Callable[[str], str]) -> str:
    """The heat map and a line naming the nodes above the threshold (links to their rows below)."""
    slots, rows, delta = heatmap["slots"], heatmap["rows"], float(heatmap["delta_c"])
    if not rows:
        return '<p class="ok">No GPU temperatures in the reports.</p>'
    cell_w = max(1.0, min(MAX_CELL_W, (WIDTH - LABEL_W) / len(rows)))
    width, height = LABEL_W + cell_w * len(rows), 18 + CELL_H * len(slots)
    parts = [f'<svg id="thermal-heatmap" role="img" aria-label="GPU temperature above the slot median, per node" '
             f'width="{width:.0f}" height="{height}" viewBox="0 0 {width:.1f} {height}" '
             f'shape-rendering="crispEdges" xmlns="http://www.w3.org/2000/svg">']
    for j, slot in enumerate(slots):
        parts.append(f'<text x="{LABEL_W - 6}" y="{18 + j * CELL_H + 12}" text-anchor="end">{_e(slot)}</text>')
    for i, row in enumerate(rows):
        x = LABEL_W + i * cell_w
        for j, above in enumerate(row["above_median_c"]):
            reading = "no reading" if above is None else f"{above:+g} °C"
            parts.append(f'<rect x="{x:.2f}" y="{18 + j * CELL_H}" width="{cell_w:.2f}" height="{CELL_H}" '
                         f'fill="{cell_colour(above, delta)}"><title>{_e(row["node"])} {_e(slots[j])}: {reading} '
                         f'against the slot median ({_e(row["profile"])})</title></rect>')
    parts.append(f'<text x="{LABEL_W}" y="12">nodes, hottest first ({len(rows)} of {heatmap["nodes"]}); '
                 f'colour: °C above the slot median, red at +{2 * delta:g} or more</text></svg>')
    hot = [(row, max(v for v in row["above_median_c"] if v is not None)) for row in rows
           if any(v is not None and v > delta for v in row["above_median_c"])]
    listed = ", ".join(f'{link(row["node"])} (+{peak:g})' for row, peak in hot[:40])
    more = f" and {len(hot) - 40} more" if len(hot) > 40 else ""
    parts.append(f'<p class="more">{len(hot)} node(s) with a GPU more than {delta:g} °C above its slot median'
                 + (f": {listed}{more}" if hot else "") + ".</p>")
    return "".join(parts)


def signatures_table(signatures: list[dict[str, Any]], link: Callable[[str], str]) -> str:
    """Failing nodes grouped by the checks that fail on them, with counts: one row per cause."""
    if not signatures:
        return '<p class="ok">No node fails a check.</p>'
    body = []
    for row in signatures[:SIGNATURE_ROWS]:
        names = ", ".join(link(n) for n in row["node_names"])
        more = f' <span class="more">and {row["nodes"] - len(row["node_names"])} more</span>' if (
            row["nodes"] > len(row["node_names"])) else ""
        critical = f'<span class="crit">{row["critical_nodes"]}</span>' if row["critical_nodes"] else "0"
        body.append(f'<tr><td class="n">{row["nodes"]}</td><td class="n">{critical}</td>'
                    f'<td>{_e(", ".join(row["checks"]))}</td><td>{names}{more}</td></tr>')
    rest = len(signatures) - SIGNATURE_ROWS
    tail = f'<p class="more">{rest} more signatures in the JSON output.</p>' if rest > 0 else ""
    return ('<table id="failure-signatures"><thead><tr><th>nodes</th><th>with critical</th><th>failing checks</th>'
            f'<th>nodes, worst first</th></tr></thead><tbody>{"".join(body)}</tbody></table>{tail}')
