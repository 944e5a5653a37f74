"""``python -m ckpt_ha.cli.alerts --team TEAM --runbook-base URL [--dashboard-base URL]
[--selector MATCHERS] [--threshold NAME=VALUE ...] [--prometheus-rule]``: print the shipped
alert rules with an organisation's team label, runbook and dashboard addresses, series selector
and thresholds (see `ckpt_ha.ops.alerts`), as a Prometheus rule file or as a Kubernetes
PrometheusRule."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ckpt_ha.ops import alerts
from ckpt_ha.ops.k8s import prometheus_rule


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ckpt_ha.cli.alerts",
        description="Print observability/alerts.yml with your team label and runbook address.",
    )
    parser.add_argument("--team", default=alerts.DEFAULT_TEAM, help="the team label of every alert")
    parser.add_argument(
        "--runbook-base",
        default=alerts.DEFAULT_RUNBOOK_BASE,
        help="absolute URL of your published docs/RUNBOOK.md; #alert-<name> is appended",
    )
    parser.add_argument(
        "--dashboard-base",
        default=alerts.DEFAULT_DASHBOARD_BASE,
        help="absolute URL of your Grafana's dashboards (…/d); /<dashboard uid> is appended",
    )
    parser.add_argument(
        "--selector",
        default="",
        help='label matchers every series the rules read must match, e.g. namespace="ml"',
    )
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a marked threshold's value (names: "
        + ", ".join(f"{k} ({v:g})" for k, v in alerts.thresholds().items())
        + ")",
    )
    parser.add_argument(
        "--prometheus-rule",
        action="store_true",
        help="print a Kubernetes PrometheusRule (prometheus-operator) instead of a rule file",
    )
    args = parser.parse_args(argv)
    try:
        values: dict[str, float] = {}
        for item in args.threshold:
            name, _, value = item.partition("=")
            try:
                values[name.strip()] = float(value)
            except ValueError:
                raise alerts.BadAlertSetting("threshold", item, "NAME=NUMBER") from None
        text = alerts.render(
            alerts.shipped(),
            team=args.team,
            runbook_base=args.runbook_base,
            dashboard_base=args.dashboard_base,
            selector=args.selector,
            values=values,
        )
    except alerts.BadAlertSetting as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(prometheus_rule(text) if args.prometheus_rule else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
