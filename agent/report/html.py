"""What every HTML page nodewarden writes shares (the fleet report, the acceptance report): its CSS.

No scripts, fonts or external resources: a page opens from a ticket attachment, offline.
"""

from __future__ import annotations

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1200px;
color:#1d232a;padding:0 16px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d6dbe1;padding-bottom:4px}
.meta{color:#5b6570;margin-bottom:16px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0}
.card{border:1px solid #d6dbe1;border-radius:6px;padding:10px 14px;min-width:120px}
.card b{display:block;font-size:22px}.card span{color:#5b6570;font-size:12px}
table{border-collapse:collapse;width:100%;margin:6px 0 4px;font-size:13px}
th,td{border-bottom:1px solid #e6e9ed;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f7;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.crit{color:#b00020;font-weight:600}.warn{color:#8a5a00}.ok{color:#1b6e2d}
.more{color:#5b6570;font-size:12px}a{color:#0b57d0;text-decoration:none}
svg text{font:11px system-ui,sans-serif;fill:#1d232a}
@media print{body{margin:0;max-width:none}h2{break-after:avoid}table,svg{break-inside:avoid}a{color:inherit}}
"""
