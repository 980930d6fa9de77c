"""`infragent ui`: a read-only web app over a ledger, on loopback. It lists runs, opens any run as its report,
follows a run in progress (server-sent events: each gate as it finishes, each trial, the budget left), and
serves the ledger's artifacts. With an API key every request needs it (Bearer header, or ?key= once, which
leaves a cookie for the browser's later requests).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import re
import time
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse

from infragent.lab.ledger import Ledger, LedgerError
from infragent.report.data import run_report
from infragent.report.page import page, table
from infragent.report.run_page import render_report
from infragent.report.svg import e
from infragent.ui.live import Cursor, changes, progress

COOKIE = "infragent_ui_key"
SHA = re.compile(r"^[0-9a-f]{64}$")


def build_ui(ledger_path: str | Path, api_key: str | None = None, poll_s: float = 1.0) -> FastAPI:
    """The dashboard's app over the ledger at ledger_path (opened read-only on every request)."""
    app = FastAPI(title="infragent ui", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ledger_path, app.state.api_key, app.state.poll_s = str(ledger_path), api_key, poll_s
    app.middleware("http")(_authorize)
    app.get("/", response_class=HTMLResponse)(runs_page)
    app.get("/runs/{run_id}", response_class=HTMLResponse)(run_page)
    app.get("/runs/{run_id}/events")(run_events)
    app.get("/api/runs")(api_runs)
    app.get("/api/runs/{run_id}")(api_run)
    app.get("/artifacts/{sha}")(artifact)
    return app


async def _authorize(request: Request, call_next: Any) -> Response:
    key = request.app.state.api_key
    if key is None:
        return await call_next(request)
    given = request.query_params.get("key") or request.cookies.get(COOKIE) or ""
    header = request.headers.get("authorization", "")
    if header.startswith("Bearer "):
        given = header[7:]
    if not hmac.compare_digest(given.encode(), key.encode()):
        return JSONResponse({"error": "invalid or missing API key: send 'Authorization: Bearer <key>', or open "
                                      "the page once as /?key=<key>"}, status_code=401)
    response = await call_next(request)
    if request.query_params.get("key"):
        response.set_cookie(COOKIE, key, httponly=True, samesite="strict")
    return response


def _ledger(request: Request) -> Ledger:
    return Ledger(request.app.state.ledger_path, readonly=True)


def _error(status: int, message: str) -> HTMLResponse:
    return HTMLResponse(page("infragent ui", e(message), [("error", "Error", f'<p class="warn">{e(message)}</p>'
                                                                       '<p><a href="/">all runs</a></p>')]), status)


def runs_page(request: Request) -> HTMLResponse:
    """Every run, newest first, each linked to its report."""
    try:
        runs = _ledger(request).runs()
    except LedgerError as err:
        return _error(500, str(err))
    rows = [f'<tr class="run-{e(r["status"])}"><td class="num" data-value="{r["id"]}"><a href="/runs/{r["id"]}">'
            f'{r["id"]}</a></td><td>{e(r["kind"])}</td><td>{e(r["status"])}</td><td data-value="{r["created"]}">'
            f'{time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"]))}</td><td class="num">{r["probes"]}</td>'
            f'<td>{e(r["spec"] or "")}</td><td>{e(r["note"] or "")}</td></tr>' for r in runs]
    body = table(["run", "kind", "status", "started", "probes", "spec", "note"], rows, sortable=True, css="runs") \
        if rows else '<p class="muted">no runs yet: <code>infragent optimize SPEC</code> records one</p>'
    return HTMLResponse(page("infragent ui", e(_ledger(request).location), [("runs", "Runs", body)]))


def run_page(request: Request, run_id: int) -> HTMLResponse:
    """The run's report; while it runs, a live panel on top that follows it without reloading."""
    try:
        ledger = _ledger(request)
        report = run_report(ledger, run_id)
    except LedgerError as err:
        return _error(404, str(err))
    live = _live_panel(run_id, progress(ledger, run_id, sum(p["charged"] for p in report.probes)))
    return HTMLResponse(render_report(report, live=live, served=True))


def _live_panel(run_id: int, status: dict[str, Any]) -> str:
    return (f'<div id="live-panel" data-run="{run_id}" data-status="{e(status["status"])}"><p class="big">'
            f'<span id="live-status">{e(status["status"])}</span> · <span id="live-budget">{e(_budget_text(status))}'
            f'</span></p><p class="muted" id="live-note">{e(status["note"] or "")}</p>'
            + table(["trial", "change", "outcome", "objective", "why"], [], css="live-trials")
            + '<h3>Gates as they finish</h3><ol id="live-gates" reversed></ol></div>' + LIVE_SCRIPT)


def _budget_text(status: dict[str, Any]) -> str:
    used = f"{status['probes_used']} probes, {status['minutes']:.1f} min used"
    if status.get("budget"):
        return f"{used}; left: {status['probes_left']} probes, {status['minutes_left']:.1f} min"
    return used


LIVE_SCRIPT = r"""<script>
(function () {
  const live = document.getElementById('live-panel'); if (!live || live.dataset.status !== 'running') return;
  const source = new EventSource('/runs/' + live.dataset.run + '/events');
  const cell = (text) => { const td = document.createElement('td'); td.textContent = text; return td; };
  const rowOf = (trial) => {
    let row = document.getElementById('live-trial-' + trial);
    if (!row) { row = document.createElement('tr'); row.id = 'live-trial-' + trial;
                live.querySelector('table.live-trials tbody').appendChild(row); }
    return row;
  };
  source.addEventListener('trial', (ev) => {
    const t = JSON.parse(ev.data), row = rowOf(t.trial);
    row.className = 'live-trial done ' + (t.accepted ? 'accepted' : '');
    row.replaceChildren(cell(t.trial), cell(typeof t.change === 'string' ? t.change : JSON.stringify(t.change)),
                        cell(t.accepted ? 'accepted' : t.status), cell(t.objective ?? 'n/a'), cell(t.why));
  });
  source.addEventListener('probe', (ev) => {
    const p = JSON.parse(ev.data), li = document.createElement('li');
    const trial = /^trial\/(\d+)\//.exec(p.key);
    if (trial) {  // the trial in progress: its row shows the gate that just finished
      const row = rowOf(trial[1]);
      if (!row.classList.contains('done')) {
        row.className = 'live-trial running';
        row.replaceChildren(cell(trial[1]), cell(''), cell('running: ' + p.key.split('/').slice(2).join('/') + ' ' +
                                                           p.verdict), cell(''), cell(p.finding));
      }
    }
    li.className = 'live-gate chip-' + p.verdict;
    li.textContent = p.key + ' ' + p.verdict.toUpperCase() + (p.cost_s ? ' (' + p.cost_s.toFixed(1) + ' s)' : '') +
                     ': ' + p.finding;
    document.getElementById('live-gates').prepend(li);
  });
  source.addEventListener('status', (ev) => {
    const s = JSON.parse(ev.data);
    document.getElementById('live-status').textContent = s.status;
    document.getElementById('live-note').textContent = s.note || '';
    document.getElementById('live-budget').textContent = s.probes_used + ' probes, ' + s.minutes.toFixed(1) +
      ' min used' + (s.budget ? '; left: ' + s.probes_left + ' probes, ' + s.minutes_left.toFixed(1) + ' min' : '');
    if (s.status !== 'running') { source.close(); live.dataset.status = s.status;
      document.getElementById('live-note').innerHTML += ' <a href="">reload for the full report</a>'; }
  });
})();
</script>"""


async def run_events(request: Request, run_id: int) -> Response:
    """Server-sent events for one run: probe, trial and status, until the run stops running."""
    try:
        _ledger(request).run(run_id)
    except LedgerError as err:
        return JSONResponse({"error": str(err)}, status_code=404)

    async def stream() -> AsyncIterator[str]:
        cursor = Cursor()
        while not await request.is_disconnected():
            ledger = _ledger(request)
            for event, data in changes(ledger, run_id, cursor):
                yield f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n"
            if cursor.status and cursor.status[0] != "running":
                return
            ledger.close()
            yield ": alive\n\n"
            await asyncio.sleep(request.app.state.poll_s)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})


def api_runs(request: Request) -> JSONResponse:
    """Every run as JSON."""
    return JSONResponse(_ledger(request).runs())


def api_run(request: Request, run_id: int) -> JSONResponse:
    """One run's status, budget and trials as JSON (what a poller needs)."""
    try:
        ledger = _ledger(request)
        cursor = Cursor()
        events = changes(ledger, run_id, cursor)
    except LedgerError as err:
        return JSONResponse({"error": str(err)}, status_code=404)
    return JSONResponse({"progress": next(d for ev, d in events if ev == "status"),
                         "trials": [d for ev, d in events if ev == "trial"]})


def artifact(request: Request, sha: str) -> Response:
    """One stored artifact by its sha256 (what the report's evidence and trace links point at)."""
    if not SHA.match(sha):
        return JSONResponse({"error": f"no artifact {sha[:80]} in this ledger"}, status_code=404)
    try:
        path = _ledger(request).artifact_path(sha)
    except LedgerError:
        path = None
    if path is None or not path.is_file():
        return JSONResponse({"error": f"no artifact {sha[:80]} in this ledger"}, status_code=404)
    return FileResponse(path, media_type="application/json")
