"""The page shell every infragent HTML page shares (style, sortable tables, the Perfetto opener) and the small
pieces the pages are made of: verdict chips, tables, bars, a timeline, a diff. Self-contained: inline CSS,
inline script, inline SVG; nothing is loaded from a network.
"""
from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any, Iterable

from infragent.report.svg import PALETTE, e

STYLE = """
:root { --ink: #111827; --muted: #6b7280; --line: #e5e7eb; --pass: #16a34a; --fail: #dc2626; --inc: #ca8a04; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: var(--ink); background: #f9fafb; }
header { background: #111827; color: #f9fafb; padding: 14px 28px; }
header h1 { margin: 0; font-size: 20px; } header p { margin: 4px 0 0; color: #d1d5db; font-size: 13px; }
nav { padding: 6px 28px; background: #1f2937; font-size: 13px; } nav a { color: #93c5fd; margin-right: 14px; }
main { padding: 8px 28px 40px; max-width: 1500px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px 18px; margin: 14px 0; }
h2 { font-size: 16px; margin: 4px 0 10px; } h3 { font-size: 14px; margin: 12px 0 6px; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 13px; }
td, th { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f4f6; position: sticky; top: 0; } table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[aria-sort="ascending"]::after { content: " ▲"; } table.sortable th[aria-sort="descending"]::after { content: " ▼"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.verdict-pass td.v, .chip.pass { color: var(--pass); } .verdict-fail td.v, .chip.fail { color: var(--fail); }
.verdict-inconclusive td.v, .chip.inconclusive { color: var(--inc); }
tr.verdict-fail { background: #fef2f2; } tr.verdict-pass { background: #f0fdf4; } tr.verdict-inconclusive { background: #fefce8; }
tr.accepted { background: #f0fdf4; } tr.best-row { outline: 2px solid #2563eb; }
.chip { display: inline-block; border: 1px solid var(--line); border-radius: 10px; padding: 0 6px; margin: 1px 2px;
  font-size: 12px; white-space: nowrap; text-decoration: none; background: #fff; }
.badge { display: inline-block; font-weight: 700; padding: 2px 10px; border-radius: 6px; color: #fff; }
.badge.win { background: var(--pass); } .badge.nowin { background: var(--fail); } .badge.measure { background: #2563eb; }
.big { font-size: 15px; margin: 6px 0; } .muted { color: var(--muted); } .warn { color: #b45309; }
.charts { display: flex; flex-wrap: wrap; gap: 10px; }
.chart { background: #fff; border: 1px solid var(--line); border-radius: 6px; }
.chart .title { font-weight: 600; font-size: 12px; } .chart .tick, .chart .legend, .chart .guide-label { font-size: 11px; fill: #374151; }
.chart .axis-label { font-size: 11px; fill: var(--muted); } .chart .grid { stroke: #f0f0f0; }
.chart .frame { fill: none; stroke: #9ca3af; } .chart .guide { stroke: #b45309; stroke-dasharray: 4 3; }
.chart .guide-label { fill: #b45309; } .chart circle.infeasible { fill-opacity: 0.35; }
.bar-row { display: flex; align-items: center; gap: 8px; margin: 2px 0; font-size: 12px; }
.bar-label { width: 260px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.bar-track { width: 420px; background: #f3f4f6; height: 12px; } .bar { display: block; height: 12px; background: #2563eb; }
pre.diff { background: #0b1020; color: #e5e7eb; padding: 10px; overflow-x: auto; font-size: 12px; }
pre.diff .add { color: #86efac; } pre.diff .del { color: #fca5a5; } pre.diff .hunk { color: #93c5fd; }
details > summary { cursor: pointer; color: #1d4ed8; }
button { font: inherit; padding: 3px 10px; border-radius: 6px; border: 1px solid #9ca3af; background: #fff; cursor: pointer; }
"""

SCRIPT = r"""
function sortBy(th) {
  const table = th.closest('table'), body = table.tBodies[0], col = [...th.parentNode.children].indexOf(th);
  const asc = th.getAttribute('aria-sort') !== 'ascending';
  table.querySelectorAll('th').forEach((h) => h.removeAttribute('aria-sort'));
  th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
  const key = (row) => { const c = row.children[col]; const v = c.dataset.value ?? c.textContent.trim();
                         const n = parseFloat(v); return isNaN(n) ? v : n; };
  const rows = [...body.rows].sort((a, b) => { const x = key(a), y = key(b);
    const r = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
    return asc ? r : -r; });
  rows.forEach((r) => body.appendChild(r));
}
document.querySelectorAll('table.sortable th').forEach((th) => th.addEventListener('click', () => sortBy(th)));
async function openInPerfetto(button) {
  const embedded = document.getElementById('trace-bytes');
  let buffer;
  if (embedded) {
    const bin = atob(embedded.textContent.trim()); const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    buffer = bytes.buffer;
  } else if (location.protocol.startsWith('http')) {
    buffer = await (await fetch(button.dataset.href)).arrayBuffer();
  } else {
    button.nextElementSibling.textContent = 'This trace is too big to travel inside the page: open the file ' +
      'link, or drop the file on ui.perfetto.dev (it opens it in your browser, nothing is uploaded).';
    return;
  }
  const ui = window.open('https://ui.perfetto.dev');
  const ping = setInterval(() => ui.postMessage('PING', 'https://ui.perfetto.dev'), 250);
  window.addEventListener('message', function ready(ev) {
    if (ev.source !== ui || ev.data !== 'PONG') return;
    clearInterval(ping); window.removeEventListener('message', ready);
    ui.postMessage({perfetto: {buffer, title: button.dataset.title, fileName: button.dataset.name}},
                   'https://ui.perfetto.dev');
  });
}
"""


def page(title: str, subtitle: str, sections: list[tuple[str, str, str]], extra_head: str = "") -> str:
    """The whole document: a header, a nav bar of the sections, and each (anchor, heading, body) section."""
    nav = "".join(f'<a href="#{e(anchor)}">{e(heading)}</a>' for anchor, heading, _ in sections)
    body = "".join(f'<section id="{e(anchor)}"><h2>{e(heading)}</h2>{content}</section>'
                   for anchor, heading, content in sections)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style>{extra_head}'
            f'</head><body><header><h1>{e(title)}</h1><p>{subtitle}</p></header><nav>{nav}</nav><main>{body}</main>'
            f'<script>{SCRIPT}</script></body></html>\n')


def fmt(x: Any, digits: int = 4) -> str:
    """A number for a table cell (n/a for missing or NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return e(x)


def chip(verdict: str, text: str, href: str = "", tip: str = "") -> str:
    """A small verdict-coloured label, a link when href is given."""
    title = f' title="{e(tip)}"' if tip else ""
    if href:
        return f'<a class="chip {e(verdict)}" href="{e(href)}"{title}>{e(text)}</a>'
    return f'<span class="chip {e(verdict)}"{title}>{e(text)}</span>'


def table(headers: Iterable[str], rows: Iterable[str], sortable: bool = False, css: str = "") -> str:
    """A table from header names and ready-made <tr> rows."""
    heads = "".join(f"<th>{e(h)}</th>" for h in headers)
    cls = " ".join(c for c in ("sortable" if sortable else "", css) if c)
    return f'<table class="{cls}"><thead><tr>{heads}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def bars(rows: list[tuple[str, float, str]], title: str = "") -> str:
    """Horizontal bars: (label, share 0-1, value text)."""
    if not rows:
        return ""
    top = max(share for _, share, _ in rows) or 1.0
    out = [f"<h3>{e(title)}</h3>"] if title else []
    for i, (label, share, text) in enumerate(rows):
        out.append(f'<div class="bar-row"><span class="bar-label" title="{e(label)}">{e(label)}</span>'
                   f'<span class="bar-track"><span class="bar" style="width:{share / top * 100:.1f}%;'
                   f'background:{PALETTE[i % len(PALETTE)]}"></span></span><span>{e(text)}</span></div>')
    return "".join(out)


def timeline(spans: list[dict[str, Any]], window_ms: float, width: int = 1100) -> str:
    """Spans on one row per thread (nested levels stacked), over window_ms."""
    if not spans:
        return '<p class="muted">the trace has no spans to draw</p>'
    lanes = sorted({(s["thread"], s["depth"]) for s in spans})
    names = sorted({s["name"] for s in spans})
    row, left = 18, 150
    parts = [f'<svg class="chart timeline" role="img" aria-label="trace timeline" width="{width}" '
             f'height="{row * len(lanes) + 34}">']
    for i, (thread, depth) in enumerate(lanes):
        parts.append(f'<text x="4" y="{22 + i * row + 12}" class="tick">{e(thread[:18])}'
                     f'{" +" + str(depth) if depth else ""}</text>')
    scale = (width - left - 10) / (window_ms or 1.0)
    for s in spans:
        y = 22 + lanes.index((s["thread"], s["depth"])) * row
        color = PALETTE[names.index(s["name"]) % len(PALETTE)]
        parts.append(f'<rect class="span" x="{left + s["start_ms"] * scale:.1f}" y="{y}" '
                     f'width="{max(0.5, s["dur_ms"] * scale):.1f}" height="{row - 4}" fill="{color}" opacity="0.8">'
                     f'<title>{e(s["name"])} on {e(s["thread"])}: {s["dur_ms"]:.3f} ms at {s["start_ms"]:.3f} ms'
                     f'</title></rect>')
    parts.append(f'<text x="{left}" y="14" class="tick">0 ms</text><text x="{width - 90}" y="14" class="tick">'
                 f'{window_ms:.2f} ms</text></svg>')
    return "".join(parts)


def diff_block(patch: str) -> str:
    """A unified diff, coloured by line kind."""
    lines = []
    for line in patch.splitlines():
        cls = ("add" if line.startswith("+") and not line.startswith("+++") else
               "del" if line.startswith("-") and not line.startswith("---") else
               "hunk" if line.startswith("@@") else "")
        lines.append(f'<span class="{cls}">{e(line)}</span>' if cls else e(line))
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def trace_link(path: str, title: str, href: str | None = None) -> str:
    """The saved trace as a file link (href: where a served page finds it), and a button that opens it in
    Perfetto's UI from this page (postMessage to ui.perfetto.dev: the trace is loaded in the browser, never
    uploaded)."""
    file = Path(path)
    href = href or file.resolve().as_uri()
    return (f'<p><a class="trace-file" href="{e(href)}">{e(file.name)}</a> '
            f'<span class="muted">({file.stat().st_size / 1e6:.2f} MB)</span> '
            f'<button class="perfetto" data-href="{e(href)}" data-title="{e(title)}" '
            f'data-name="{e(file.name)}.json" onclick="openInPerfetto(this)">Open in Perfetto</button> '
            f'<span class="muted perfetto-note"></span></p>')


def embedded_bytes(path: str) -> str:
    """A file's bytes inside the page (base64), for the Perfetto opener to post without reading the disk."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<script type="application/octet-stream;base64" id="trace-bytes">{data}</script>'
