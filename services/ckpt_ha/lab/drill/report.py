"""The acceptance report of one or more drills: Markdown, JSON, a self-contained HTML page and a
JUnit XML file.

Pure: renders the results `ckpt_ha.lab.drill.run` returns (exactly what ``--json`` prints) into
text; writing the files is the caller's. Evidence is shown as named fields, never as JSON; a
level the scenario does not reach by design (its ``expected_levels``) reads "not expected"
rather than failed. The HTML page has no external asset: its loss plot is an inline SVG of the
baseline's curve (the uninterrupted run, same seed) against the drill run's, with the
checkpoints, the faults and the resumes marked. The JUnit file has one test case per scenario so
that a CI system lists drills as tests, with the reasons of a failure.
"""

from __future__ import annotations

import html
import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ckpt_ha.lab.drill.assess import LEVELS

ATTEMPT_COLOURS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WIDTH, HEIGHT, PAD_L, PAD_R, PAD_T, PAD_B = 760, 320, 60, 20, 20, 40
NOT_EXPECTED = "not expected"

Result = Mapping[str, Any]


def as_json(output: Result | Sequence[Result]) -> str:
    """Exactly what ``ckpt-ha drill --json`` prints: one object, or a list for ``all``."""
    return json.dumps(output, indent=2, default=str)


def _phases(result: Result) -> list[Result]:
    return list(result.get("phases") or [result])


def level_mark(phase: Result, name: str) -> str:
    """``PASS``, ``FAIL``, or ``not expected`` for a level that did not pass and that the
    scenario does not reach by design (absent ``expected_levels``: all five are expected)."""
    level = (phase.get("levels") or {}).get(name) or {}
    if level.get("passed"):
        return "PASS"
    return "FAIL" if name in phase.get("expected_levels", LEVELS) else NOT_EXPECTED


def _css(mark: str) -> str:
    return {"PASS": "pass", "FAIL": "fail"}.get(mark, "na")


def label(key: str) -> str:
    """A field name for a person: ``bytes_verified`` reads ``bytes verified``, ``event_id``
    reads ``event``; a Prometheus series (``metrics_after``) keeps its name and shows its
    labels in parentheses, without braces: ``ckpt_ha_x_total (outcome=loaded)``."""
    if key == "event_id":
        return "event"
    name, brace, labels = key.partition("{")
    if brace:
        pairs = [p for p in labels.rstrip("}").split(",") if p and not p.endswith("=")]
        return f"{name} ({', '.join(pairs)})" if pairs else name
    return key.replace("_", " ")


def _field(key: str, value: Any) -> Any:
    """A timestamp series' value as a UTC time rather than seconds since 1970."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and value > 0 and key.partition("{")[0].endswith("timestamp_seconds"):
        return datetime.fromtimestamp(value, UTC).isoformat(timespec="seconds")
    return value


def scalar(value: Any) -> str:
    """One value as text: ``yes``/``no`` for booleans, ``none`` for null, short floats."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _comparison(c: Mapping[str, Any]) -> str:
    tol = f" ± {scalar(c['tolerance'])}" if c.get("tolerance") else ""
    verdict = "ok" if c.get("ok") else "NOT ok"
    return (f"{c['name']}: observed {scalar(c.get('observed'))}, expected "
            f"{scalar(c.get('expected'))}{tol}: {verdict}")  # fmt: skip


def _is_comparison(value: Any) -> bool:
    return isinstance(value, Mapping) and {"name", "observed", "expected", "ok"} <= set(value)


def as_text(value: Any) -> str:
    """Any evidence value (nested mappings and lists of JSON) as one line of plain words:
    ``key: value; key: value``, list items joined by commas, nested mappings in parentheses."""
    if _is_comparison(value):
        return _comparison(value)
    if isinstance(value, Mapping):
        if not value:
            return "none"
        parts = []
        for k, v in value.items():
            text = as_text(_field(str(k), v))
            nested = isinstance(v, Mapping) and v and not _is_comparison(v)
            parts.append(f"{label(str(k))}: ({text})" if nested else f"{label(str(k))}: {text}")
        return "; ".join(parts)
    if isinstance(value, list | tuple):
        if not value:
            return "none"
        if any(isinstance(v, Mapping) for v in value):
            return " | ".join(as_text(v) for v in value)
        return ", ".join(scalar(v) for v in value)
    return scalar(value)


def as_html(value: Any) -> str:
    """Any evidence value as HTML: a mapping is a table of named fields (nested ones nest), a
    list of records a list, a list of scalars comma-separated; all text escaped."""
    if _is_comparison(value):
        cls = "pass" if value.get("ok") else "fail"
        return f'<span class="{cls}">{_e(_comparison(value))}</span>'
    if isinstance(value, Mapping):
        if not value:
            return "none"
        rows = "".join(f"<tr><th>{_e(label(str(k)))}</th><td>{as_html(_field(str(k), v))}"
                       f"</td></tr>" for k, v in value.items())  # fmt: skip
        return f'<table class="fields">{rows}</table>'
    if isinstance(value, list | tuple):
        if not value:
            return "none"
        if any(isinstance(v, Mapping) for v in value):
            return "<ul>" + "".join(f"<li>{as_html(v)}</li>" for v in value) + "</ul>"
        return _e(", ".join(scalar(v) for v in value))
    return _e(scalar(value))


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _durations(d: Mapping[str, Any]) -> str:
    return (
        f"fault to resume.verified {d['total']:.2f} s: control plane {d['control_plane']:.2f} s "
        f"(detect {d['detect']:.2f}, plan {d['plan']:.3f}, relaunch {d['relaunch']:.2f}, "
        f"verdict {d['verdict']:.3f}), job {d['load'] + d['compute']:.2f} s (load "
        f"{d['load']:.2f}, compute {d['compute']:.2f})"
    )


PHASE_FIELDS = ("last_valid_checkpoint", "restored_from", "continue_step", "recompute_steps")
"""Shown for every phase, in this order, before its levels."""
SHOWN = frozenset({
    "scenario", "verdict", "job", "elapsed_seconds", "fault", "baseline", "reasons", "checks",
    "phases", "levels", "expected_levels", "timeline", "durations", "curves", "marks",
    *PHASE_FIELDS,
})  # fmt: skip
"""Keys the report renders in their own place; every other key of a result is listed under
"more evidence" as named fields."""


def _more(result: Result) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in SHOWN}


def markdown(results: Sequence[Result]) -> str:
    passed = sum(r.get("verdict") == "pass" for r in results)
    out = [
        "# ckpt-ha drill report",
        "",
        f"{passed} of {len(results)} drills passed.",
        "",
        "| scenario | verdict | job | seconds | fault |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| {r['scenario']} | {r['verdict'].upper()} | {r.get('job')} | "
        f"{r.get('elapsed_seconds', '')} | {_md_cell(str(r.get('fault', '')))} |"
        for r in results
    ]
    for r in results:
        out += ["", f"## {r['scenario']}: {r['verdict'].upper()}", ""]
        out.append(f"- fault (the one variable changed): {r.get('fault')}")
        for key, value in (r.get("baseline") or {}).items():
            out.append(f"- baseline {label(key)}: {as_text(value)}")
        out.extend(f"- reason: {reason}" for reason in r.get("reasons") or [])
        for what, ok in (r.get("checks") or {}).items():
            out.append(f"- check {'PASS' if ok else 'FAIL'}: {what}")
        for phase in _phases(r):
            out += ["", f"### {phase['scenario']}", ""]
            for key in PHASE_FIELDS:
                out.append(f"- {label(key)}: {scalar(phase.get(key))}")
            if phase.get("durations"):
                out.append(f"- durations: {_durations(phase['durations'])}")
            if phase.get("levels"):
                out += ["", "| level | result | evidence |", "|---|---|---|"]
                for name in LEVELS:
                    level = phase["levels"].get(name) or {}
                    evidence = as_text(level.get("evidence") or {})
                    out.append(f"| {name} | {level_mark(phase, name)} | {_md_cell(evidence)} |")
            if phase.get("timeline"):
                out += ["", "| t (s) | event |", "|---|---|"]
                for t in phase["timeline"]:
                    at = t.get("t_seconds")
                    out.append(f"| {'' if at is None else f'{at:+.2f}'} | {_md_cell(t['what'])} |")
        more = _more(r)
        if more:
            out += ["", "### more evidence", ""]
            out.extend(f"- {label(k)}: {as_text(v)}" for k, v in more.items())
    return "\n".join(out) + "\n"


def _scale(lo: float, hi: float, a: float, b: float) -> Any:
    span = (hi - lo) or 1.0
    return lambda v: a + (v - lo) / span * (b - a)


def loss_svg(result: Result) -> str:
    """An inline SVG: baseline loss (grey) against the drill run's (one colour per attempt),
    with checkpoints (green), faults (red) and resumes (blue) as vertical lines."""
    curves = result.get("curves") or {}
    base = [(float(s), float(v)) for s, v in curves.get("baseline") or []]
    runs = [(float(s), float(v), int(a)) for s, v, a in curves.get("drill") or []]
    points = [v for _, v in base] + [v for _, v, _ in runs]
    steps = [s for s, _ in base] + [s for s, _, _ in runs]
    title = html.escape(f"loss per step: {result.get('scenario')}")
    if not points:
        return (f'<svg width="{WIDTH}" height="40" '
                f'role="img"><title>{title}</title><text x="10" y="25">no loss recorded'
                f"</text></svg>")  # fmt: skip
    log = all(v > 0 for v in points)
    tr = (lambda v: math.log10(v)) if log else (lambda v: v)
    ys = [tr(v) for v in points]
    x = _scale(0.0, max(steps), PAD_L, WIDTH - PAD_R)
    y = _scale(min(ys), max(ys), HEIGHT - PAD_B, PAD_T)

    def path(pts: Sequence[tuple[float, float]]) -> str:
        return " ".join(f"{x(s):.1f},{y(tr(v)):.1f}" for s, v in pts)

    parts = [
        f'<svg width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" font-family="sans-serif" font-size="11">',
        f"<title>{title}</title>",
        f'<rect x="{PAD_L}" y="{PAD_T}" width="{WIDTH - PAD_L - PAD_R}" '
        f'height="{HEIGHT - PAD_T - PAD_B}" fill="none" stroke="#999"/>',
    ]
    marks = result.get("marks") or {}
    for kind, colour, dash in (("checkpoints", "#2ca02c", "2,3"), ("faults", "#d62728", ""),
                               ("resumes", "#1f77b4", "6,3")):  # fmt: skip
        for m in marks.get(kind) or []:
            if m.get("step") is None:
                continue
            px = x(float(m["step"]))
            label = html.escape(
                f"{kind[:-1]} at step {m['step']}: {m.get('what') or m.get('checkpoint_id') or ''}"
            )
            parts.append(
                f'<line class="{kind}" x1="{px:.1f}" x2="{px:.1f}" y1="{PAD_T}" '
                f'y2="{HEIGHT - PAD_B}" stroke="{colour}" stroke-dasharray="{dash}">'
                f"<title>{label}</title></line>"
            )
    if base:
        parts.append(f'<polyline class="baseline" fill="none" stroke="#888" stroke-width="3" '
                     f'points="{path(base)}"><title>baseline (uninterrupted, same seed)</title>'
                     f"</polyline>")  # fmt: skip
    for i, attempt in enumerate(sorted({a for _, _, a in runs})):
        pts = [(s, v) for s, v, a in runs if a == attempt]
        colour = ATTEMPT_COLOURS[i % len(ATTEMPT_COLOURS)]
        parts.append(f'<polyline class="drill" fill="none" stroke="{colour}" stroke-width="1.2" '
                     f'points="{path(pts)}"><title>drill run, attempt {attempt}</title>'
                     f"</polyline>")  # fmt: skip
    lo, hi = min(points), max(points)
    parts += [
        f'<text x="{PAD_L}" y="{HEIGHT - 8}">step 0</text>',
        f'<text x="{WIDTH - PAD_R}" y="{HEIGHT - 8}" text-anchor="end">step {max(steps):g}</text>',
        f'<text x="4" y="{PAD_T + 10}">{hi:.3g}</text>',
        f'<text x="4" y="{HEIGHT - PAD_B}">{lo:.3g}</text>',
        f'<text x="{WIDTH / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle">loss'
        f"{' (log scale)' if log else ''}: grey baseline, coloured drill attempts; green "
        f"checkpoints, red faults, blue resumes</text>",
        "</svg>",
    ]
    return "\n".join(parts)


def _e(value: Any) -> str:
    return html.escape(str(value))


def page(results: Sequence[Result]) -> str:
    """The HTML report: one section per drill, no external asset (inline CSS and SVG)."""
    passed = sum(r.get("verdict") == "pass" for r in results)
    body = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>ckpt-ha drill report</title>',
        "<style>body{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;"
        "font-size:13px;vertical-align:top;text-align:left}th{background:#f6f8fa}"
        "table.fields{margin:0}table.fields td,table.fields th{border-color:#e4e4e4}"
        "ul{margin:0;padding-left:1.2em}.pass{color:#1a7f37;font-weight:bold}"
        ".fail{color:#cf222e;font-weight:bold}.na{color:#6e7781;font-style:italic}"
        "code{font-size:12px;word-break:break-all}</style>",
        "</head><body>",
        "<h1>ckpt-ha drill report</h1>",
        f"<p>{passed} of {len(results)} drills passed.</p>",
        '<table id="summary"><tr><th>scenario</th><th>verdict</th><th>job</th><th>seconds</th>'
        "<th>fault</th></tr>",
    ]
    for r in results:
        v = str(r.get("verdict", "fail"))
        cls, shown = {"pass": "pass", "fail": "fail"}.get(v, "na"), v.upper().replace("_", " ")
        body.append(f'<tr class="scenario"><td><a href="#{_e(r["scenario"])}">'
                    f'{_e(r["scenario"])}</a></td><td class="{cls}">{_e(shown)}</td>'
                    f"<td>{_e(scalar(r.get('job')))}</td><td>{_e(r.get('elapsed_seconds', ''))}"
                    f"</td><td>{_e(r.get('fault', ''))}</td></tr>")  # fmt: skip
    body.append("</table>")
    for r in results:
        v = str(r.get("verdict", "fail"))
        cls, shown = {"pass": "pass", "fail": "fail"}.get(v, "na"), v.upper().replace("_", " ")
        body.append(f'<h2 id="{_e(r["scenario"])}">{_e(r["scenario"])}: '
                    f'<span class="{cls}">{_e(shown)}</span></h2>')  # fmt: skip
        body.append(f"<p>fault (the one variable changed): {_e(r.get('fault'))}</p>")
        if r.get("baseline"):
            body.append('<table class="baseline">')
            for key, value in r["baseline"].items():
                body.append(f"<tr><th>baseline {_e(label(key))}</th><td>{as_html(value)}</td></tr>")
            body.append("</table>")
        body.append(loss_svg(r))
        if r.get("reasons"):
            body.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in r["reasons"]) + "</ul>")
        if r.get("checks"):
            body.append('<table class="checks">')
            for what, ok in r["checks"].items():
                cls = "pass" if ok else "fail"
                body.append(f'<tr><td class="{cls}">{"PASS" if ok else "FAIL"}</td>'
                            f"<td>{_e(what)}</td></tr>")  # fmt: skip
            body.append("</table>")
        for phase in _phases(r):
            body.append(f'<h3>{_e(phase["scenario"])}</h3><table class="phase">')
            body.extend(
                f"<tr><th>{_e(label(key))}</th><td>{_e(scalar(phase.get(key)))}</td></tr>"
                for key in PHASE_FIELDS
            )
            if phase.get("durations"):
                body.append(f"<tr><th>durations</th><td>{_e(_durations(phase['durations']))}"
                            f"</td></tr>")  # fmt: skip
            body.append("</table>")
            if phase.get("levels"):
                body.append('<table class="levels"><tr><th>level</th><th>result</th>'
                            "<th>evidence</th></tr>")  # fmt: skip
                for name in LEVELS:
                    level = phase["levels"].get(name) or {}
                    mark = level_mark(phase, name)
                    body.append(f'<tr class="level"><td>{name}</td><td class="{_css(mark)}">'
                                f'{_e(mark)}</td><td class="evidence">'
                                f"{as_html(level.get('evidence') or {})}</td></tr>")  # fmt: skip
                body.append("</table>")
            if phase.get("timeline"):
                body.append('<table class="timeline"><tr><th>t (s)</th><th>event</th></tr>')
                for t in phase["timeline"]:
                    at = t.get("t_seconds")
                    body.append(f"<tr><td>{'' if at is None else f'{at:+.2f}'}</td>"
                                f"<td>{_e(t['what'])}</td></tr>")  # fmt: skip
                body.append("</table>")
        more = _more(r)
        if more:
            body.append('<h3>more evidence</h3><table class="more">')
            body.extend(f'<tr><th>{_e(label(k))}</th><td class="evidence">{as_html(value)}</td>'
                        f"</tr>" for k, value in more.items())  # fmt: skip
            body.append("</table>")
    body.append("</body></html>")
    return "\n".join(body) + "\n"


def junit(results: Sequence[Result]) -> str:
    """JUnit XML: one test case per scenario (class ``ckpt-ha.drill``), a ``failure`` with the
    reasons for a failed drill, ``skipped`` for one this installation could not run, and the
    drill's levels and checks as its output, so CI systems list drills as tests."""
    failed = [r for r in results if r.get("verdict") not in ("pass", "not_run")]
    skipped = [r for r in results if r.get("verdict") == "not_run"]
    total = sum(float(r.get("elapsed_seconds") or 0) for r in results)
    counts = {"tests": str(len(results)), "failures": str(len(failed)), "errors": "0",
              "skipped": str(len(skipped)), "time": f"{total:.2f}"}  # fmt: skip
    suites = ET.Element("testsuites", {"name": "ckpt-ha drills", **counts})
    suite = ET.SubElement(suites, "testsuite", {"name": "ckpt-ha drill", **counts})
    for r in results:
        case = ET.SubElement(suite, "testcase", {
            "classname": "ckpt-ha.drill", "name": str(r["scenario"]),
            "time": f"{float(r.get('elapsed_seconds') or 0):.2f}",
        })  # fmt: skip
        props = ET.SubElement(case, "properties")
        for key in ("job", "fault", *PHASE_FIELDS):
            if r.get(key) is not None:
                ET.SubElement(props, "property", {"name": key, "value": scalar(r[key])})
        reasons = [str(x) for x in r.get("reasons") or []]
        if r in skipped:
            ET.SubElement(case, "skipped", {"message": "; ".join(reasons) or "not run"})
        elif r in failed:
            failure = ET.SubElement(case, "failure", {
                "type": "stopped" if r.get("stopped") else "drill failed",
                "message": "; ".join(reasons) or f"verdict {r.get('verdict')}",
            })  # fmt: skip
            failure.text = "\n".join(reasons) or None
        ET.SubElement(case, "system-out").text = _story(r)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _story(r: Result) -> str:
    lines = [f"fault: {r.get('fault')}"]
    lines += [f"check {'PASS' if ok else 'FAIL'}: {what}" for what, ok in
              (r.get("checks") or {}).items()]  # fmt: skip
    for phase in _phases(r):
        if not phase.get("levels"):
            continue
        lines.append(f"{phase['scenario']}: restored from {phase.get('restored_from')}")
        for name in LEVELS:
            evidence = ((phase["levels"].get(name) or {}).get("evidence")) or {}
            lines.append(f"  {level_mark(phase, name):<12} {name:<10} {as_text(evidence)}")
    return "\n".join(lines)


JUNIT = "junit.xml"
"""The JUnit file's name in a report folder (point a CI system's test-report setting at it)."""


def files(output: Result | Sequence[Result]) -> dict[str, str]:
    """The report's files by name: report.md, report.json (what ``--json`` prints),
    report.html and junit.xml, for one drill's result or the list of ``all``."""
    results = [output] if isinstance(output, Mapping) else list(output)
    return {"report.md": markdown(results), "report.json": as_json(output),
            "report.html": page(results), JUNIT: junit(results)}  # fmt: skip
