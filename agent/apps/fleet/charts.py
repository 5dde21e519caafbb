"""The fleet page's bar charts (compliance by check and profile, Xids) and firmware version shares, as
inline SVG: nothing is loaded from anywhere, the page stays one self-contained file.
"""

from __future__ import annotations

import html
from typing import Any

from agent.core.sanitise import clean


def _e(value: Any) -> str:
    return html.escape("" if value is None else clean(str(value)))


def bar_chart(items: list[tuple[str, float, str]], title: str, maximum: float | None = None, unit: str = "") -> str:
    """Horizontal bars: (label, value, css color)."""
    if not items:
        return ""
    width, bar_h, label_w = 760, 18, 260
    top = max(maximum or 0, *(v for _, v, _ in items)) or 1
    height = 24 + len(items) * (bar_h + 6)
    parts = [
        f'<svg role="img" aria-label="{_e(title)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="0" y="14" font-weight="600">{_e(title)}</text>',
    ]
    for i, (label, value, color) in enumerate(items):
        y = 24 + i * (bar_h + 6)
        length = max(1.0, (width - label_w - 70) * value / top)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{_e(label[:40])}</text>'
            f'<rect x="{label_w}" y="{y}" width="{length:.1f}" height="{bar_h}" fill="{color}"/>'
            f'<text x="{label_w + length + 4:.1f}" y="{y + 13}">{value:g}{_e(unit)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def stacked_bar(component: str, versions: list[dict[str, Any]]) -> str:
    """One component's versions as shares of its nodes (oldest first)."""
    palette = ["#b00020", "#e07b00", "#c9a400", "#5b8def", "#2e7d32", "#6a4c93", "#00838f", "#8d6e63"]
    total = sum(v["nodes"] for v in versions) or 1
    width, height = 760, 36
    x = 0.0
    parts = [
        f'<svg role="img" aria-label="{_e(component)} versions" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, version in enumerate(versions):
        share = width * version["nodes"] / total
        parts.append(
            f'<rect x="{x:.1f}" y="0" width="{share:.1f}" height="18" fill="{palette[i % len(palette)]}">'
            f"<title>{_e(version['version'])}: {version['nodes']} nodes</title></rect>"
        )
        if share > 60:
            parts.append(f'<text x="{x + 3:.1f}" y="31">{_e(version["version"])} ({version["nodes"]})</text>')
        x += share
    parts.append("</svg>")
    return "".join(parts)
