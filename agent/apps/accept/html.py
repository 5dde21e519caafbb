"""The acceptance picture: one self-contained HTML page, inline SVG (no script, no network), like the fleet report.

Per metric (power, GPU temperature, SM clock, memory temperature) one chart with a curve per GPU over
the whole run, the steady window shaded, and the GPUs with a failed or warned finding drawn thick in
red and named: the operator looks rather than reads. Below, the findings that are not a pass.
Curves are thinned to at most MAX_POINTS points each (bucket means), so a 10-hour run stays small.
"""

from __future__ import annotations

import html
from typing import Any

from agent.core.model import Status
from agent.core.sanitise import clean
from agent.core.series import GpuTrack, Recording
from agent.report.html import CSS
from agent.report.model import Report

MAX_POINTS = 600
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 900, 220, 48, 120, 10, 24
CHARTS = (("power_w", "Power draw", "W"), ("temp_c", "GPU temperature", "°C"), ("sm_mhz", "SM clock", "MHz"),
          ("mem_temp_c", "Memory temperature", "°C"))
PHASE_CSS = ".phase{fill:#e8f0fe}.gpu{fill:none;stroke:#8a94a0;stroke-width:1}.out{fill:none;stroke:#b00020;" \
            "stroke-width:2.2}.axis{stroke:#d6dbe1}"


def _e(value: Any) -> str:
    return html.escape("" if value is None else clean(str(value)))


def thin(t: list[float], values: list[Any]) -> list[tuple[float, float]]:
    """(t, value) pairs, gaps dropped, bucket-averaged down to MAX_POINTS."""
    points = [(float(x), float(v)) for x, v in zip(t, values, strict=False)
              if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(points) <= MAX_POINTS:
        return points
    size = len(points) / MAX_POINTS
    out = []
    for i in range(MAX_POINTS):
        bucket = points[int(i * size):max(int((i + 1) * size), int(i * size) + 1)]
        out.append((sum(p[0] for p in bucket) / len(bucket), sum(p[1] for p in bucket) / len(bucket)))
    return out


def chart(recording: Recording, key: str, title: str, unit: str, outliers: set[str]) -> str:
    curves = {g.label: thin(g.series["t"], g.series[key]) for g in recording.gpus}
    values = [v for pts in curves.values() for _, v in pts]
    end = max([p[1] for p in recording.phases.values() if len(p) == 2] + [1.0])
    if not values:
        return f"<p class=more>{_e(title)}: no readings</p>"
    low, high = min(values), max(values)
    if high - low < 1e-9:
        low, high = low - 1, high + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + t / end * plot_w

    def y(v: float) -> float:
        return TOP + (high - v) / (high - low) * plot_h

    parts = [f'<svg role="img" aria-label="{_e(title)} per GPU" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg">']
    steady = recording.steady_window()
    if steady is not None:
        parts.append(f'<rect class="phase" x="{x(steady[0]):.1f}" y="{TOP}" width="{x(steady[1]) - x(steady[0]):.1f}" '
                     f'height="{plot_h}"><title>steady window</title></rect>'
                     f'<text x="{x(steady[0]) + 4:.1f}" y="{TOP + 12}">steady</text>')
    parts.append(f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}"/>')
    for value in (low, high):
        parts.append(f'<text x="{LEFT - 4}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.0f}</text>')
    parts.append(f'<text x="{LEFT}" y="{HEIGHT - 6}">0 s</text><text x="{LEFT + plot_w}" y="{HEIGHT - 6}" '
                 f'text-anchor="end">{end:.0f} s</text><text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 6}" '
                 f'text-anchor="middle">{_e(title)} ({_e(unit)})</text>')
    order = sorted(curves, key=lambda label: label in outliers)  # outliers drawn last, on top
    for label in order:
        pts = curves[label]
        if not pts:
            continue
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        css = "out" if label in outliers else "gpu"
        parts.append(f'<polyline class="{css}" points="{path}"><title>{_e(label)}</title></polyline>')
        if label in outliers:
            last_t, last_v = pts[-1]
            parts.append(f'<text x="{x(last_t) + 4:.1f}" y="{y(last_v) + 4:.1f}" class="crit">{_e(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _gpu_row(gpu: GpuTrack, outliers: set[str]) -> str:
    state = "lost: " + (gpu.lost or "") if gpu.lost else ("outlier" if gpu.label in outliers else "ok")
    css = "crit" if gpu.lost or gpu.label in outliers else "ok"
    return (f"<tr><td>{_e(gpu.label)}</td><td>{_e(gpu.uuid)}</td><td>{_e(gpu.name)}</td><td>{_e(gpu.vbios)}</td>"
            f"<td class={css}>{_e(state)}</td></tr>")


def render_html(recording: Recording, report: Report) -> str:
    bad = [f for f in report.findings if f.status in (Status.FAIL, Status.WARN, Status.UNKNOWN) and f.waiver is None]
    outliers = {f.subject for f in bad if f.subject.startswith("gpu")}
    passed = report.extra.get("acceptance", {}).get("passed", report.exit_code == 0)
    verdict = "<span class=ok>ACCEPTED</span>" if passed else "<span class=crit>NOT ACCEPTED</span>"
    load = recording.load
    phases = ", ".join(f"{name} {span[0]:.0f}-{span[1]:.0f} s" for name, span in recording.phases.items()
                       if len(span) == 2)
    parts = ["<!doctype html><html lang=en><head><meta charset=utf-8>",
             f"<title>nodewarden accept {_e(recording.hostname)}</title><style>{CSS}{PHASE_CSS}</style></head><body>",
             f"<h1>Acceptance under load: {_e(recording.hostname)} — {verdict}</h1>",
             f"<div class=meta>run {_e(recording.run_id)}, {_e(recording.started_at)} to {_e(recording.finished_at)}; "
             f"profile {_e(recording.profile)}; driver {_e(recording.driver)}; load {_e(load.get('kind'))} "
             f"({_e(load.get('described'))}): {_e(load.get('outcome'))}; {_e(phases)}; baseline "
             f"{_e(report.extra.get('acceptance', {}).get('baseline'))}</div>"]
    for key, title, unit in CHARTS:
        parts.append(f"<h2>{_e(title)}</h2>" + chart(recording, key, title, unit, outliers))
    parts.append("<h2>Findings not passing</h2>")
    if bad:
        parts.append("<table><tr><th>status</th><th>check</th><th>subject</th><th>message</th></tr>")
        for f in bad:
            css = "crit" if f.status is Status.FAIL else "warn"
            parts.append(f"<tr><td class={css}>{_e(f.status.value)}</td><td>{_e(f.check)}</td><td>{_e(f.subject)}</td>"
                         f"<td>{_e(f.message)}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p class=ok>none</p>")
    parts.append("<h2>GPUs</h2><table><tr><th>GPU</th><th>UUID</th><th>model</th><th>VBIOS</th><th>state</th></tr>")
    parts.extend(_gpu_row(g, outliers) for g in recording.gpus)
    parts.append("</table></body></html>\n")
    return "".join(parts)
