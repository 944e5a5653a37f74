"""The shipped alert rules (``observability/alerts.yml``) with an organisation's own values.

The file ships valid as it is (``promtool check rules`` passes on it) with two defaults an
organisation replaces when installing it: the ``team`` label of every alert (`DEFAULT_TEAM`)
and the address its ``runbook_url`` annotations start with (`DEFAULT_RUNBOOK_BASE`, a
placeholder: where your copy of docs/RUNBOOK.md is published). `render` swaps them textually, so
the comments and the order of the rules stay as shipped.
"""

from __future__ import annotations

import re
import urllib.parse

from ckpt_ha.assets import asset
from ckpt_ha.ops.errors import OperationFailed

ALERTS = asset("observability", "alerts.yml")
DEFAULT_TEAM = "ckpt-ha"
DEFAULT_RUNBOOK_BASE = "https://runbooks.example.com/ckpt-ha/RUNBOOK.md"
"""What every ``runbook_url`` starts with in the shipped file; ``#alert-<name>`` follows."""

_TEAM_LINE = re.compile(rf"^(\s+team: ){re.escape(DEFAULT_TEAM)}$", re.MULTILINE)
_TEAM_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class BadAlertSetting(OperationFailed):
    def __init__(self, name: str, value: str, expected: str) -> None:
        self.name = name
        self.value = value
        super().__init__(f"{name} {value!r}: expected {expected}")


def render(text: str, *, team: str = DEFAULT_TEAM, runbook_base: str = DEFAULT_RUNBOOK_BASE) -> str:
    """``text`` (the shipped rules) with ``team`` as every alert's team label and
    ``runbook_base`` (an absolute http(s) URL of the runbook page) before each ``#alert-…``."""
    if not _TEAM_VALUE.fullmatch(team):
        raise BadAlertSetting("team", team, "letters, digits, '_', '.' or '-'")
    url = urllib.parse.urlsplit(runbook_base)
    if url.scheme not in ("http", "https") or not url.netloc or url.fragment or '"' in runbook_base:
        raise BadAlertSetting("runbook base", runbook_base, "an absolute http(s) URL, no '#'")
    text = _TEAM_LINE.sub(lambda m: m.group(1) + team, text)
    return text.replace(f'runbook_url: "{DEFAULT_RUNBOOK_BASE}#', f'runbook_url: "{runbook_base}#')


def shipped() -> str:
    return ALERTS.read_text()
