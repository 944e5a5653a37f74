"""The shipped alert rules (``observability/alerts.yml``) with an organisation's own values.

The file ships valid as it is (``promtool check rules`` passes on it) with defaults an
organisation replaces when installing it: the ``team`` label of every alert (`DEFAULT_TEAM`),
the address its ``runbook_url`` annotations start with (`DEFAULT_RUNBOOK_BASE`, a placeholder:
where your copy of docs/RUNBOOK.md is published), the Grafana address its ``dashboard_url``
annotations start with (`DEFAULT_DASHBOARD_BASE`), a label selector every series the rules read
must match (none: e.g. ``namespace="ml-platform"`` where several installs share a Prometheus),
and the thresholds marked ``# threshold: NAME`` in the rules (`thresholds`). `render` swaps them
textually, so the comments and the order of the rules stay as shipped (a mixin without jsonnet).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping

from ckpt_ha.assets import asset
from ckpt_ha.ops.errors import OperationFailed

ALERTS = asset("observability", "alerts.yml")
DEFAULT_TEAM = "ckpt-ha"
DEFAULT_RUNBOOK_BASE = "https://runbooks.example.com/ckpt-ha/RUNBOOK.md"
"""What every ``runbook_url`` starts with in the shipped file; ``#alert-<name>`` follows."""
DEFAULT_DASHBOARD_BASE = "https://grafana.example.com/d"
"""What every ``dashboard_url`` starts with in the shipped file; ``/<dashboard uid>`` follows."""

_TEAM_LINE = re.compile(rf"^(\s+team: ){re.escape(DEFAULT_TEAM)}$", re.MULTILINE)
_TEAM_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_MATCHER = r'[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"'
_SELECTOR = re.compile(rf"{_MATCHER}(?:\s*,\s*{_MATCHER})*")
_METRIC = re.compile(r"(?<![\w:])(ckpt_ha_[a-z0-9_]+)(\{)?")
_THRESHOLD = re.compile(
    r"^(?P<code>.*?)(?P<value>\d+(?:\.\d+)?)(?P<rest>[^\d#]*#\s*threshold:\s*(?P<name>[a-z_]+)\s*)$"
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


class BadAlertSetting(OperationFailed):
    def __init__(self, name: str, value: str, expected: str) -> None:
        self.name = name
        self.value = value
        super().__init__(f"{name} {value!r}: expected {expected}")


def _expr_lines(text: str) -> list[bool]:
    """For each line of ``text``: is it PromQL (an ``expr:`` value)?"""
    marks: list[bool] = []
    block_indent: int | None = None
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip())
        if block_indent is not None and (not line.strip() or indent > block_indent):
            marks.append(True)
            continue
        block_indent = None
        stripped = line.strip()
        if stripped.startswith("expr:"):
            rest = stripped[len("expr:") :].strip()
            if rest in ("|", ">", "|-", ">-"):
                block_indent = indent
                marks.append(False)
            else:
                marks.append(True)
            continue
        marks.append(False)
    return marks


def thresholds(text: str | None = None) -> dict[str, float]:
    """The thresholds the rules mark (``# threshold: NAME`` after a value), with their
    shipped values."""
    text = shipped() if text is None else text
    found: dict[str, float] = {}
    for line, is_expr in zip(text.split("\n"), _expr_lines(text), strict=True):
        m = _THRESHOLD.match(line) if is_expr else None
        if m:
            found.setdefault(m.group("name"), float(m.group("value")))
    return found


def _select(code: str, selector: str) -> str:
    def add(m: re.Match[str]) -> str:
        return f"{m.group(1)}{{{selector}," if m.group(2) else f"{m.group(1)}{{{selector}}}"

    return _METRIC.sub(add, code).replace(",}", "}")


def render(
    text: str,
    *,
    team: str = DEFAULT_TEAM,
    runbook_base: str = DEFAULT_RUNBOOK_BASE,
    dashboard_base: str = DEFAULT_DASHBOARD_BASE,
    selector: str = "",
    values: Mapping[str, float] | None = None,
) -> str:
    """``text`` (the shipped rules) with ``team`` as every alert's team label, ``runbook_base``
    (an absolute http(s) URL of the runbook page) before each ``#alert-…``, ``dashboard_base``
    before each dashboard uid, ``selector`` (``label="value",…``) on every series read, and
    ``values`` in place of the marked thresholds of the same names."""
    if not _TEAM_VALUE.fullmatch(team):
        raise BadAlertSetting("team", team, "letters, digits, '_', '.' or '-'")
    for name, base in (("runbook base", runbook_base), ("dashboard base", dashboard_base)):
        url = urllib.parse.urlsplit(base)
        if url.scheme not in ("http", "https") or not url.netloc or url.fragment or '"' in base:
            raise BadAlertSetting(name, base, "an absolute http(s) URL, no '#'")
    if selector and not _SELECTOR.fullmatch(selector.strip()):
        raise BadAlertSetting("selector", selector, 'label matchers, e.g. namespace="ml"')
    values = dict(values or {})
    unknown = sorted(set(values) - set(thresholds(text)))
    if unknown:
        raise BadAlertSetting("threshold", ", ".join(unknown), f"one of {sorted(thresholds(text))}")
    lines = text.split("\n")
    for i, is_expr in enumerate(_expr_lines(text)):
        if not is_expr:
            continue
        line = lines[i]
        m = _THRESHOLD.match(line)
        if m and m.group("name") in values:
            line = f"{m.group('code')}{values[m.group('name')]:g}{m.group('rest')}"
        if selector:
            code, hash_, comment = line.partition("#")
            line = _select(code, selector.strip()) + hash_ + comment
        lines[i] = line
    text = "\n".join(lines)
    text = _TEAM_LINE.sub(lambda m: m.group(1) + team, text)
    text = text.replace(
        f'dashboard_url: "{DEFAULT_DASHBOARD_BASE}/',
        f'dashboard_url: "{dashboard_base.rstrip("/")}/',
    )
    return text.replace(f'runbook_url: "{DEFAULT_RUNBOOK_BASE}#', f'runbook_url: "{runbook_base}#')


def shipped() -> str:
    return ALERTS.read_text()
