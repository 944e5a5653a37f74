"""The acceptance report of one or more drills: Markdown, JSON and a self-contained HTML page.

Pure: renders the results `ckpt_ha.drill.run` returns (exactly what ``--json`` prints) into
text; writing the files is the caller's. The HTML page has no external asset: its loss plot is
an inline SVG of the baseline's curve (the uninterrupted run, same seed) against the drill run's,
with the checkpoints, the faults and the resumes marked.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

LEVELS = ("generated", "verified", "registered", "loadable", "continued")
ATTEMPT_COLOURS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WIDTH, HEIGHT, PAD_L, PAD_R, PAD_T, PAD_B = 760, 320, 60, 20, 20, 40

Result = Mapping[str, Any]


def as_json(output: Result | Sequence[Result]) -> str:
    """Exactly what ``ckpt-ha drill --json`` prints: one object, or a list for ``all``."""
    return json.dumps(output, indent=2, default=str)


def _phases(result: Result) -> list[Result]:
    return list(result.get("phases") or [result])


def _evidence(level: Mapping[str, Any]) -> str:
    return json.dumps(level.get("evidence") or {}, default=str, sort_keys=True)


def _durations(d: Mapping[str, Any]) -> str:
    return (
        f"fault to resume.verified {d['total']:.2f} s: control plane {d['control_plane']:.2f} s "
        f"(detect {d['detect']:.2f}, plan {d['plan']:.3f}, relaunch {d['relaunch']:.2f}, "
        f"verdict {d['verdict']:.3f}), job {d['load'] + d['compute']:.2f} s (load "
        f"{d['load']:.2f}, compute {d['compute']:.2f})"
    )


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
        f"{r.get('elapsed_seconds', '')} | {r.get('fault', '')} |"
        for r in results
    ]
    for r in results:
        out += ["", f"## {r['scenario']}: {r['verdict'].upper()}", ""]
        out.append(f"- fault (the one variable changed): {r.get('fault')}")
        if r.get("baseline"):
            b = r["baseline"]
            out.append(f"- baseline model: {b.get('model')}")
            out.append(f"- baseline data: {b.get('data')}")
            out.append(f"- baseline config: `{json.dumps(b.get('config'), sort_keys=True)}`")
            out.append(f"- baseline environment: `{json.dumps(b.get('environment'))}`")
            out.append(f"- baseline resources: `{json.dumps(b.get('resources'))}`")
        out.extend(f"- reason: {reason}" for reason in r.get("reasons") or [])
        for what, ok in (r.get("checks") or {}).items():
            out.append(f"- check {'PASS' if ok else 'FAIL'}: {what}")
        for phase in _phases(r):
            out += ["", f"### {phase['scenario']}", ""]
            for key in ("last_valid_checkpoint", "restored_from", "continue_step",
                        "recompute_steps"):  # fmt: skip
                out.append(f"- {key.replace('_', ' ')}: {phase.get(key)}")
            if phase.get("durations"):
                out.append(f"- durations: {_durations(phase['durations'])}")
            if phase.get("levels"):
                out += ["", "| level | result | evidence |", "|---|---|---|"]
                for name in LEVELS:
                    level = phase["levels"].get(name) or {}
                    mark = "PASS" if level.get("passed") else "FAIL"
                    out.append(f"| {name} | {mark} | `{_evidence(level)[:300]}` |")
            if phase.get("timeline"):
                out += ["", "| t (s) | event |", "|---|---|"]
                for t in phase["timeline"]:
                    at = t.get("t_seconds")
                    out.append(f"| {'' if at is None else f'{at:+.2f}'} | {t['what']} |")
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
        "font-size:13px;vertical-align:top}.pass{color:#1a7f37;font-weight:bold}"
        ".fail{color:#cf222e;font-weight:bold}code{font-size:12px;word-break:break-all}</style>",
        "</head><body>",
        "<h1>ckpt-ha drill report</h1>",
        f"<p>{passed} of {len(results)} drills passed.</p>",
        "<table><tr><th>scenario</th><th>verdict</th><th>job</th><th>seconds</th></tr>",
    ]
    for r in results:
        v = r.get("verdict", "fail")
        body.append(f"<tr><td><a href=\"#{_e(r['scenario'])}\">{_e(r['scenario'])}</a></td>"
                    f'<td class="{_e(v)}">{_e(v.upper())}</td><td>{_e(r.get("job"))}</td>'
                    f"<td>{_e(r.get('elapsed_seconds', ''))}</td></tr>")  # fmt: skip
    body.append("</table>")
    for r in results:
        v = r.get("verdict", "fail")
        body.append(f'<h2 id="{_e(r["scenario"])}">{_e(r["scenario"])}: '
                    f'<span class="{_e(v)}">{_e(v.upper())}</span></h2>')  # fmt: skip
        body.append(f"<p>fault (the one variable changed): {_e(r.get('fault'))}</p>")
        if r.get("baseline"):
            body.append("<table>")
            for key in ("model", "data", "config", "environment", "resources"):
                value = r["baseline"].get(key)
                shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
                body.append(f"<tr><th>baseline {key}</th><td><code>{_e(shown)}</code></td></tr>")
            body.append("</table>")
        body.append(loss_svg(r))
        if r.get("reasons"):
            body.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in r["reasons"]) + "</ul>")
        if r.get("checks"):
            body.append("<table>")
            for what, ok in r["checks"].items():
                cls = "pass" if ok else "fail"
                body.append(f'<tr><td class="{cls}">{"PASS" if ok else "FAIL"}</td>'
                            f"<td>{_e(what)}</td></tr>")  # fmt: skip
            body.append("</table>")
        for phase in _phases(r):
            body.append(f"<h3>{_e(phase['scenario'])}</h3><table>")
            body.extend(
                f"<tr><th>{_e(key.replace('_', ' '))}</th><td>{_e(phase.get(key))}</td></tr>"
                for key in ("last_valid_checkpoint", "restored_from", "continue_step",
                            "recompute_steps")
            )  # fmt: skip
            if phase.get("durations"):
                body.append(f"<tr><th>durations</th><td>{_e(_durations(phase['durations']))}"
                            f"</td></tr>")  # fmt: skip
            body.append("</table>")
            if phase.get("levels"):
                body.append("<table><tr><th>level</th><th>result</th><th>evidence</th></tr>")
                for name in LEVELS:
                    level = phase["levels"].get(name) or {}
                    ok = bool(level.get("passed"))
                    body.append(f'<tr><td>{name}</td><td class="{"pass" if ok else "fail"}">'
                                f'{"PASS" if ok else "FAIL"}</td><td><code>'
                                f"{_e(_evidence(level))}</code></td></tr>")  # fmt: skip
                body.append("</table>")
            if phase.get("timeline"):
                body.append("<table><tr><th>t (s)</th><th>event</th></tr>")
                for t in phase["timeline"]:
                    at = t.get("t_seconds")
                    body.append(f"<tr><td>{'' if at is None else f'{at:+.2f}'}</td>"
                                f"<td>{_e(t['what'])}</td></tr>")  # fmt: skip
                body.append("</table>")
    body.append("</body></html>")
    return "\n".join(body) + "\n"


def files(output: Result | Sequence[Result]) -> dict[str, str]:
    """The report's files by name: report.md, report.json (what ``--json`` prints) and
    report.html, for one drill's result or the list of ``all``."""
    results = [output] if isinstance(output, Mapping) else list(output)
    return {"report.md": markdown(results), "report.json": as_json(output),
            "report.html": page(results)}  # fmt: skip
