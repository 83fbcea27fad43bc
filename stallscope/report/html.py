"""The self-contained HTML report (``report.html``, ``stallscope html``, ``check --html``).

Made from the report alone (and the gate's verdict as ``check --format json`` gives it), never
from live objects. One file, no network: the charts are inline SVG drawn here, a few lines of
plain JavaScript show a step's numbers on hover, and a Content-Security-Policy forbids every
fetch (``default-src 'none'``) and any script but ours (by its hash). Why no chart library:
docs/development.md, "The HTML report".

A report is input from whoever made it. Every string from it reaches the page through ``_h``
(``plain``, then HTML-escaped, quotes included); numbers are formatted here; the data the script
reads sits in a ``<script type="application/json">`` block with ``<``, ``>``, ``&``, U+2028 and
U+2029 escaped (``_json_for_script``), so no string can close the block or open markup.

Top to bottom: the headline and the ranked fixes; where the time went per epoch (stacked bars)
and the idle fraction over the run's windows; the timeline of the last steps per rank; the
samplers' series (NVML utilization, CPU) when present; the ranks; the notes. Colours follow the
terminal panel and the trace (data red, compute green, h2d yellow); every bar and segment also
carries its name and number as text, so the page reads without colour, and prints.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from stallscope._version import __version__
from stallscope.analysis.finding import Finding
from stallscope.report.recent import RecentSteps, Series
from stallscope.report.safe import plain
from stallscope.report.schema import Report, Summary
from stallscope.report.trace import phase_order

#: the last steps of each rank the timeline draws (the report keeps more; ``stallscope trace``
#: shows them all)
TIMELINE_STEPS = 100
#: drawing sizes, px
WIDTH = 880
LABEL_W = 120
ROW_H = 26
#: a row of the timeline, px
TIMELINE_ROW_H = 40

#: phase colours: the terminal panel's (data red, compute green, the rest yellow-ish) and the
#: trace's hues, readable on a light and a dark background
PHASE_COLOURS = {
    "data": "#d62728",
    "h2d": "#e6b000",
    "compute": "#2ca02c",
    "logging": "#8c8c8c",
    "checkpoint": "#8c6d31",
    "validation": "#9467bd",
    "other": "#b8b8b8",
}
CUSTOM_COLOURS = ("#1f77b4", "#17becf", "#e377c2", "#bcbd22")


def _h(text: object) -> str:
    """A string from a report (or anything else) as HTML text: ``plain``, then escaped."""
    return html.escape(plain(str(text)), quote=True)


def _json_for_script(value: Any) -> str:
    """JSON that cannot end a ``<script>`` element or start markup inside one."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return text


def colour(name: str, order: Sequence[str] = ()) -> str:
    if name in PHASE_COLOURS:
        return PHASE_COLOURS[name]
    custom = [n for n in order if n not in PHASE_COLOURS]
    index = custom.index(name) if name in custom else sum(map(ord, name))
    return CUSTOM_COLOURS[index % len(CUSTOM_COLOURS)]


def _pct(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _secs(s: float) -> str:
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def _n(x: float) -> str:
    """A coordinate: one decimal at most."""
    return f"{x:.1f}".removesuffix(".0")


# -- the page ----------------------------------------------------------------------------------

_CSS = """
:root{--bg:#fff;--fg:#1b1b1b;--muted:#5f5f5f;--line:#d4d4d4;--card:#f6f6f6;--bad:#b3261e;--good:#1e6b2f}
@media (prefers-color-scheme:dark){:root{--bg:#141414;--fg:#e8e8e8;--muted:#a8a8a8;--line:#3c3c3c;
--card:#1f1f1f;--bad:#ff8a80;--good:#8bd49a}}
*{box-sizing:border-box}
body{margin:0 auto;max-width:940px;padding:16px 24px;background:var(--bg);color:var(--fg);
font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid var(--line);
padding-bottom:4px}
.muted{color:var(--muted)}.headline{font-size:18px;font-weight:600;margin:10px 0}
.fix{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:10px 14px;margin:10px 0;
break-inside:avoid}
.fix .gain{font-weight:700}.fix p{margin:4px 0}.fix pre,.snippet{background:var(--bg);
border:1px solid var(--line);padding:8px;overflow:auto;font-size:13px;white-space:pre-wrap}
table{border-collapse:collapse;width:100%;font-size:14px}th,td{text-align:left;padding:4px 8px;
border-bottom:1px solid var(--line)}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
svg{display:block;max-width:100%;height:auto;overflow:visible}svg text{fill:var(--fg);
font:12px system-ui,sans-serif}
svg .axis{stroke:var(--line)}svg .muted{fill:var(--muted)}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:6px 0;font-size:13px}.legend span::before{content:"";
display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px;background:var(--c);
border:1px solid var(--line)}
#tip{position:fixed;pointer-events:none;background:var(--card);color:var(--fg);border:1px solid var(--line);
border-radius:4px;padding:4px 8px;font-size:13px;display:none;white-space:pre;z-index:9}
.verdict{font-size:20px;font-weight:700}.verdict.bad{color:var(--bad)}.verdict.good{color:var(--good)}
ul.notes li{margin:4px 0}
@media print{body{max-width:none;padding:0}#tip{display:none!important}h2{break-after:avoid}
svg,table,.fix{break-inside:avoid}
:root{--bg:#fff;--fg:#000;--muted:#444;--line:#bbb;--card:#fff}}
"""

_JS = """
(function(){
var tip=document.getElementById('tip');
function show(e,text){tip.textContent=text;tip.style.display='block';tip.style.left=(e.clientX+14)+'px';
 tip.style.top=(e.clientY+14)+'px';}
function hide(){tip.style.display='none';}
document.querySelectorAll('[data-tip]').forEach(function(el){
 el.addEventListener('mousemove',function(e){show(e,el.getAttribute('data-tip'));});
 el.addEventListener('mouseleave',hide);});
var node=document.getElementById('stallscope-data');
if(!node){return;}
var data=JSON.parse(node.textContent);
document.querySelectorAll('svg.timeline').forEach(function(svg){
 var rows=data.timeline;
 svg.addEventListener('mouseleave',hide);
 svg.addEventListener('mousemove',function(e){
  var box=svg.getBoundingClientRect(),scale=box.width/svg.viewBox.baseVal.width;
  var x=(e.clientX-box.left)/scale,y=(e.clientY-box.top)/scale;
  var row=rows[Math.floor((y-data.top)/data.rowH)];
  if(!row||x<data.left){hide();return;}
  var us=row.t0+(x-data.left)*row.usPerPx,best=-1;
  for(var i=0;i<row.start.length;i++){if(row.start[i]<=us){best=i;}else{break;}}
  if(best<0){hide();return;}
  var lines=[row.label+' · step '+(row.first+best)];
  row.names.forEach(function(n,j){var v=row.phases[j][best];if(v>0){
 lines.push(n+': '+(v>=1000?(v/1000).toFixed(2)+' ms':v+' µs'));}});
  show(e,lines.join('\\n'));});});
})();
"""
_JS_HASH = "sha256-" + base64.b64encode(hashlib.sha256(_JS.encode("utf-8")).digest()).decode("ascii")


def _page(title: str, body: str, data: Mapping[str, Any]) -> str:
    csp = (
        f"default-src 'none'; style-src 'unsafe-inline'; script-src '{_JS_HASH}'; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<meta name="color-scheme" content="light dark">'
        f"<title>{_h(title)}</title><style>{_CSS}</style></head>\n<body>\n"
        f"{body}\n"
        '<div id="tip" role="tooltip"></div>\n'
        f'<script type="application/json" id="stallscope-data">{_json_for_script(data)}</script>\n'
        f"<script>{_JS}</script>\n"
        f'<p class="muted">made by StallScope {_h(__version__)} · self-contained: no network</p>\n'
        "</body></html>\n"
    )


def _legend(names: Sequence[str]) -> str:
    items = "".join(f'<span style="--c:{colour(n, names)}">{_h(n)}</span>' for n in names)
    return f'<div class="legend">{items}</div>'


# -- sections ----------------------------------------------------------------------------------


def _headline(report: Report) -> str:
    s = report.summary
    device = report.run.device
    what = "accelerator" if device.kind != "cpu" else "training (no GPU)"
    job = f" · job of {len(report.ranks)} ranks" if report.ranks else ""
    return (
        f'<p class="headline" id="headline">{_h(what)} idle <span id="idle">{_pct(s.gpu_idle_fraction)}</span>'
        f' <span class="muted">({_h(s.idle_source)})</span> · {s.steps} steps in {_secs(s.wall_s)}'
        f" ({s.steps_per_s:.1f} steps/s){_h(job)}</p>"
    )


def _run_line(report: Report) -> str:
    r = report.run
    parts = [f"host {r.host}", f"{r.device.kind} {r.device.name}".strip(), r.framework, f"torch {r.torch_version}"]
    if r.started_at:
        parts.append(f"started {r.started_at}")
    if not report.complete:
        parts.append("written mid-run")
    return f'<p class="muted">{" · ".join(_h(p) for p in parts if p)}</p>'


def _speedup(f: Finding) -> str:
    x = f"×{f.est_speedup:.2f}"
    return f"at least {x}" if f.est_speedup_bound == "lower" else x


def _fixes(findings: Sequence[Finding]) -> str:
    if not findings:
        return '<h2>Fixes</h2><p id="fixes">No fix predicted to save a noticeable share of wall time.</p>'
    out = ['<h2>Fixes, best first</h2><div id="fixes">']
    for i, f in enumerate(findings, 1):
        suggestion = ", ".join(f"{k}={json.dumps(v)}" for k, v in f.suggestion.items())
        out.append(
            f'<div class="fix" data-finding="{_h(f.id)}"><div class="title">{i}. <code>{_h(f.id)}</code> '
            f'<span class="gain">predicted speedup {_speedup(f)}'
            f" · saves {_pct(f.est_saving_fraction)} of wall time</span>"
            f' <span class="muted">· confidence {_h(f.confidence)}</span></div>'
            + (f"<div><b>{_h(f.title)}</b></div>" if f.title else "")
            + (f"<p>{_h(f.fix)}</p>" if f.fix else "")
            + (f'<div class="muted">setting: <code>{_h(suggestion)}</code></div>' if suggestion else "")
            + (f"<pre>{_h_block(f.snippet)}</pre>" if f.snippet else "")
            + "</div>"
        )
    out.append("</div>")
    return "".join(out)


def _h_block(text: str) -> str:
    """A multi-line string (a snippet) escaped line by line, its line breaks kept."""
    return "\n".join(_h(line) for line in text.splitlines())


def _stacked_bars(rows: Sequence[tuple[str, Mapping[str, float], str]], names: Sequence[str], css_id: str) -> str:
    """One horizontal bar per row, its phases' fractions stacked, each segment labelled when wide
    enough and titled (hover, and read by a screen reader)."""
    bar_w = WIDTH - LABEL_W - 70
    height = len(rows) * ROW_H + 4
    parts = [
        f'<svg id="{css_id}" class="bars" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img">'
    ]
    # each phase's escaped name and colour once, not once a segment (a run of many epochs)
    names_h = {name: _h(name) for name in names}
    fills = {name: colour(name, names) for name in names}
    for i, (label, fractions, extra) in enumerate(rows):
        y = i * ROW_H + 2
        parts.append(f'<text x="0" y="{y + 16}">{_h(label)}</text>')
        x = float(LABEL_W)
        for name in names:
            frac = fractions.get(name, 0.0)
            if frac <= 0:
                continue
            w = frac * bar_w
            pct, name_h = _pct(frac), names_h[name]
            tip = _h(f"{label} · {name}: {pct}")
            parts.append(
                f'<rect class="seg" data-phase="{name_h}" data-fraction="{frac:.6f}"'
                f' x="{_n(x)}" y="{y}" width="{_n(w)}"'
                f' height="{ROW_H - 6}" fill="{fills[name]}"'
                f' data-tip="{tip}"><title>{tip}</title></rect>'
            )
            if w > 64:
                parts.append(f'<text x="{_n(x + 4)}" y="{y + 15}" style="fill:#000">{name_h} {pct}</text>')
            x += w
        parts.append(f'<text x="{WIDTH - 66}" y="{y + 16}" class="muted">{_h(extra)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _phase_names(summaries: Sequence[Summary]) -> list[str]:
    names: list[str] = []
    for s in summaries:
        for name, frac in s.phase_fractions.items():
            if frac > 0 and name not in names:
                names.append(name)
    return phase_order(names)


def _where_time_went(report: Report) -> str:
    epochs = [e for e in report.epochs if e.summary.wall_s > 0]
    summaries = [report.summary, *(e.summary for e in epochs)]
    names = _phase_names(summaries)
    rows = [("run", report.summary.phase_fractions, f"idle {_pct(report.summary.gpu_idle_fraction)}")]
    shown = epochs[-40:]  # a long run: its last 40 epochs
    rows += [
        (f"epoch {e.index}", e.summary.phase_fractions, f"idle {_pct(e.summary.gpu_idle_fraction)}") for e in shown
    ]
    more = f'<p class="muted">the last {len(shown)} of {len(epochs)} epochs</p>' if len(shown) < len(epochs) else ""
    return "<h2>Where the time went</h2>" + _legend(names) + _stacked_bars(rows, names, "epochs") + more


def _idle_windows(summary: Summary) -> str:
    windows = [w for w in summary.idle_windows if isinstance(w.get("idle_fraction"), (int, float))]
    if len(windows) < 2:
        return ""
    h, top = 140, 10
    left = 48
    plot_w = WIDTH - left - 10
    total = sum(float(w.get("wall_s", 0.0)) for w in windows) or 1.0
    parts = [
        f"<h2>Idle fraction over the run</h2>"
        f'<svg id="idle-windows" viewBox="0 0 {WIDTH} {h + 30}" width="{WIDTH}" height="{h + 30}" role="img">'
    ]
    for frac in (0.0, 0.5, 1.0):
        y = top + (1 - frac) * h
        parts.append(f'<line class="axis" x1="{left}" x2="{WIDTH - 10}" y1="{_n(y)}" y2="{_n(y)}"/>')
        parts.append(f'<text x="0" y="{_n(y + 4)}" class="muted">{frac:.0%}</text>')
    at = 0.0
    for i, w in enumerate(windows):
        wall = float(w.get("wall_s", 0.0))
        idle = min(1.0, max(0.0, float(w["idle_fraction"])))
        x = left + at / total * plot_w
        bw = max(0.5, wall / total * plot_w - 0.5)
        # the tip is made of numbers alone: nothing in it to escape
        tip = f"window {i + 1}: {int(w.get('steps', 0))} steps, {_secs(wall)}, idle {_pct(idle)}"
        parts.append(
            f'<rect class="win" x="{_n(x)}" y="{_n(top + (1 - idle) * h)}" width="{_n(bw)}" height="{_n(idle * h)}"'
            f' fill="#d62728" fill-opacity="0.75" data-tip="{tip}"><title>{tip}</title></rect>'
        )
        at += wall
    parts.append(
        f'<text x="{left}" y="{h + 26}" class="muted">run time → ({_secs(total)}'
        f"; each bar a window of steps)</text></svg>"
    )
    return "".join(parts)


def _timeline(records: Sequence[RecentSteps]) -> tuple[str, list[dict[str, Any]], int]:
    """The last ``TIMELINE_STEPS`` steps of each rank, one row each, on the row's own time axis
    (from its first drawn step to the end of its last), one path per phase."""
    if not records:
        return "", [], 0
    names = phase_order({n for r in records for n in r.phases_us})
    top = 4
    row_h = TIMELINE_ROW_H
    height = top + len(records) * row_h + 24
    plot_w = WIDTH - LABEL_W - 10
    parts = [
        "<h2>The last steps</h2>",
        _legend(names),
        f'<svg id="timeline" class="timeline" viewBox="0 0 {WIDTH} {height}"'
        f' width="{WIDTH}" height="{height}" role="img"'
        f' data-left="{LABEL_W}" data-plot-width="{plot_w}">',
    ]
    rows: list[dict[str, Any]] = []
    for k, r in enumerate(records):
        n = min(r.steps, TIMELINE_STEPS)
        first = r.steps - n
        starts = r.start_us[first:]
        columns = [(name, r.phases_us[name][first:]) for name in phase_order(r.phases_us)]
        t0 = starts[0]
        end = max(s + sum(c[i] for _, c in columns) for i, s in enumerate(starts))
        span = max(1, end - t0)
        us_per_px = span / plot_w
        y = top + k * row_h
        label = f"rank {r.rank}" if r.rank is not None else "steps"
        parts.append(f'<text x="0" y="{y + row_h // 2 + 4}">{_h(label)}</text>')
        paths: dict[str, list[str]] = {name: [] for name, _ in columns}
        for i, s in enumerate(starts):
            at = s
            for name, values in columns:
                us = values[i]
                if us > 0:
                    x = LABEL_W + (at - t0) / us_per_px
                    paths[name].append(f"M{_n(x)} {y + 2}h{_n(max(us / us_per_px, 0.3))}v{row_h - 8}H{_n(x)}z")
                at += us
        for name, d in paths.items():
            if d:
                parts.append(
                    f'<path data-phase="{_h(name)}" data-row="{k}" fill="{colour(name, names)}" d="{"".join(d)}"/>'
                )
        parts.append(
            f'<g class="row" data-row="{k}" data-t0-us="{t0}" data-us-per-px="{us_per_px:.6f}" data-steps="{n}"></g>'
        )
        rows.append(
            {
                "label": label,
                "first": r.first_step + first,
                "t0": t0,
                "usPerPx": us_per_px,
                "start": list(starts),
                "names": [name for name, _ in columns],
                "phases": [list(values) for _, values in columns],
            }
        )
    last = records[0]
    n0 = min(last.steps, TIMELINE_STEPS)
    parts.append(
        f'<text x="{LABEL_W}" y="{height - 6}" class="muted">the last {n0} steps of each rank, time →'
        f" (hover a step for its phases; <tspan>stallscope trace</tspan> gives all {last.steps} kept)</text></svg>"
    )
    text = _timeline_summary(records, names)
    return "".join(parts) + text, rows, top


def _timeline_summary(records: Sequence[RecentSteps], names: Sequence[str]) -> str:
    """The timeline in numbers (for reading without colour, or without the picture): each rank's
    mean time per step in each phase over the steps kept."""
    head = "".join(f'<th class="num">{_h(n)}</th>' for n in names)
    rows = []
    for r in records:
        n = max(1, r.steps)
        cells = "".join(f'<td class="num">{_secs(sum(r.phases_us.get(name, ())) / n / 1e6)}</td>' for name in names)
        label = f"rank {r.rank}" if r.rank is not None else "steps"
        rows.append(f"<tr><td>{_h(label)} ({r.steps} steps)</td>{cells}</tr>")
    return f'<table id="timeline-means"><tr><th>mean per step</th>{head}</tr>{"".join(rows)}</table>'


def _series(series: Sequence[Series]) -> str:
    if not series:
        return ""
    out = ["<h2>Samplers</h2>"]
    h, top, left = 110, 10, 48
    plot_w = WIDTH - left - 10
    for s in series:
        if len(s.t_ms) < 3:
            continue
        t_max = max(s.t_ms) or 1.0
        v_max = 1.0 if s.unit == "fraction" else max(1.0, math.ceil(max(s.values)))
        points = " ".join(
            f"{_n(left + t / t_max * plot_w)},{_n(top + (1 - min(v, v_max) / v_max) * h)}"
            for t, v in zip(s.t_ms, s.values, strict=False)
        )
        mean = sum(s.values) / len(s.values)
        shown = _pct(mean) if s.unit == "fraction" else f"{mean:.2f} {s.unit}"
        label = {
            "gpu_util": "GPU utilization (NVML)",
            "host_cpu": "training process CPU",
            "workers_cpu": "loader workers' CPU",
        }
        title = label.get(s.name, s.name)
        out.append(
            f'<div><b>{_h(title)}</b> <span class="muted">mean {_h(shown)}</span></div>'
            f'<svg class="series" data-series="{_h(s.name)}"'
            f' viewBox="0 0 {WIDTH} {h + 26}" width="{WIDTH}" height="{h + 26}" role="img">'
            f'<line class="axis" x1="{left}" x2="{WIDTH - 10}" y1="{top + h}" y2="{top + h}"/>'
            f'<text x="0" y="{top + 4}" class="muted"'
            f">{_h(_pct(v_max) if s.unit == 'fraction' else f'{v_max:g}')}</text>"
            f'<text x="0" y="{top + h}" class="muted">0</text>'
            f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{points}"/>'
            f'<text x="{left}" y="{h + 24}" class="muted">run time → ({_secs(t_max / 1000)})</text></svg>'
        )
    return "".join(out)


def _ranks(report: Report) -> str:
    if not report.ranks:
        return ""
    names = _phase_names([])
    for e in report.ranks:
        for name, frac in e.phase_fractions.items():
            if frac > 0 and name not in names:
                names.append(name)
    names = phase_order(names)
    rows = [(f"rank {e.rank}", e.phase_fractions, f"idle {_pct(e.gpu_idle_fraction)}") for e in report.ranks]
    table = "".join(
        f"<tr><td>{e.rank}</td><td>{_h(e.host)}</td>"
        f'<td class="num">{e.steps}</td><td class="num">{_secs(e.wall_s)}</td>'
        f'<td class="num">{e.steps_per_s:.1f}</td><td class="num">{_pct(e.gpu_idle_fraction)}</td>'
        f'<td class="num">{_pct(e.phase_fractions.get("data"))}</td></tr>'
        for e in report.ranks
    )
    return (
        "<h2>Ranks</h2>"
        + _legend(names)
        + _stacked_bars(rows, names, "ranks")
        + '<table id="ranks-table"><tr><th>rank</th><th>host</th><th class="num">steps</th><th class="num">wall</th>'
        + f'<th class="num">steps/s</th><th class="num">idle</th><th class="num">data wait</th></tr>{table}</table>'
    )


def _notes(notes: Sequence[str]) -> str:
    if not notes:
        return ""
    items = "".join(f"<li>{_h(n)}</li>" for n in notes)
    return f'<h2>Notes</h2><ul class="notes" id="notes">{items}</ul>'


def render_report(report: Report, records: Sequence[RecentSteps] | None = None) -> str:
    """The HTML page of ``report`` (``records``: every rank's recent steps; the report's own by default)."""
    records = tuple(report.recent if records is None else records)
    timeline, rows, top = _timeline(records)
    body = "".join(
        (
            "<h1>StallScope report</h1>",
            _run_line(report),
            _headline(report),
            _fixes(report.findings),
            _where_time_went(report),
            _idle_windows(report.summary),
            timeline,
            _series(report.series),
            _ranks(report),
            _notes(report.notes),
        )
    )
    data = {
        "timeline": rows,
        "left": LABEL_W,
        "top": top,
        "rowH": TIMELINE_ROW_H,
        "idle": report.summary.gpu_idle_fraction,
    }
    return _page("StallScope report", body, data)


# -- the gate's verdict ------------------------------------------------------------------------


def render_verdict(verdict: Mapping[str, Any]) -> str:
    """The HTML page of the CI gate's verdict (``check --format json``'s object): the baseline
    runs and the current one, the bound, the phases that grew, the findings that explain it."""
    regressed = verdict.get("verdict") == "regression"
    word = "REGRESSION" if regressed else "PASS"
    body = [
        "<h1>StallScope gate</h1>",
        f'<p class="verdict {"bad" if regressed else "good"}" id="verdict">{word}</p>',
        f'<p id="summary">{_h(verdict.get("summary", ""))}</p>',
    ]
    runs: list[tuple[str, float, str]] = []
    base = verdict.get("baseline") or {}
    for run in base.get("runs", []):
        runs.append((str(run.get("name", "baseline")), float(run.get("gpu_idle_fraction", 0.0)), "baseline"))
    for run in (verdict.get("current") or {}).get("runs", []):
        runs.append((str(run.get("name", "current")), float(run.get("gpu_idle_fraction", 0.0)), "current"))
    spread = verdict.get("spread") or {}
    bound = spread.get("bound")
    limit = None
    if isinstance(base.get("gpu_idle_fraction"), (int, float)) and isinstance(
        verdict.get("max_increase"), (int, float)
    ):
        limit = float(base["gpu_idle_fraction"]) + float(verdict.get("allowed_increase") or verdict["max_increase"])
    if runs:
        h = len(runs) * ROW_H + 30
        bar_w = WIDTH - 260 - 70
        parts = [
            f"<h2>Idle fraction: baseline runs and this one</h2>"
            f'<svg id="gate" viewBox="0 0 {WIDTH} {h}" width="{WIDTH}" height="{h}" role="img">'
        ]
        for i, (name, idle, kind) in enumerate(runs):
            y = i * ROW_H + 2
            fill = "#d62728" if kind == "current" and regressed else "#2ca02c" if kind == "current" else "#8c8c8c"
            label = f"{kind}: {name}"
            parts.append(f'<text x="0" y="{y + 16}">{_h(label[:40])}</text>')
            parts.append(
                f'<rect class="run" data-kind="{kind}" data-idle="{idle:.6f}"'
                f' x="260" y="{y}" width="{_n(max(0.5, idle * bar_w))}"'
                f' height="{ROW_H - 6}" fill="{fill}"><title>{_h(label)}: idle {_pct(idle)}</title></rect>'
            )
            parts.append(f'<text x="{_n(266 + idle * bar_w)}" y="{y + 16}">{_pct(idle)}</text>')
        for value, what, dash in ((bound, "bound", "6 3"), (limit, "threshold", "2 3")):
            if isinstance(value, (int, float)) and 0 <= value <= 1:
                x = 260 + value * bar_w
                parts.append(
                    f'<line class="limit" data-limit="{what}" x1="{_n(x)}" x2="{_n(x)}"'
                    f' y1="0" y2="{h - 24}" stroke="var(--fg)" stroke-dasharray="{dash}"/>'
                    f'<text x="{_n(x + 3)}" y="{h - 8}" class="muted">{what} {_pct(value)}</text>'
                )
        parts.append("</svg>")
        body.append("".join(parts))
    facts = [
        ("increase", _pct(verdict.get("increase"))),
        ("allowed increase", _pct(verdict.get("allowed_increase"))),
        ("prediction bound", _pct(bound) if isinstance(bound, (int, float)) else "–"),
        ("method", str(verdict.get("method", ""))),
    ]
    body.append(
        '<table id="gate-facts">' + "".join(f"<tr><th>{_h(k)}</th><td>{_h(v)}</td></tr>" for k, v in facts) + "</table>"
    )
    deltas = verdict.get("phase_deltas") or []
    grown = [d for d in deltas if isinstance(d.get("delta"), (int, float)) and d["delta"] > 0]
    if grown:
        rows = "".join(
            f'<tr><td>{_h(d.get("phase", ""))}</td><td class="num">{_pct(d.get("baseline"))}</td>'
            f'<td class="num">{_pct(d.get("current"))}</td><td class="num">+{_pct(d.get("delta"))}</td></tr>'
            for d in grown
        )
        body.append(
            '<h2>Phases that grew</h2><table id="grown"><tr><th>phase</th><th class="num">baseline</th>'
            f'<th class="num">current</th><th class="num">change</th></tr>{rows}</table>'
        )
    findings = verdict.get("findings") or []
    if findings:
        items = "".join(
            f'<div class="fix"><b>{_h(f.get("fix") or f.get("title", ""))}</b><div class="muted">{_h(f.get("id", ""))}'
            f" · saves {_pct(f.get('est_saving_fraction'))}</div></div>"
            for f in findings
        )
        body.append(f"<h2>Findings that explain it</h2>{items}")
    body.append(_notes([str(n) for n in verdict.get("notes") or []]))
    return _page(f"StallScope gate: {word}", "".join(body), {"timeline": [], "left": 0, "top": 0, "rowH": ROW_H})
