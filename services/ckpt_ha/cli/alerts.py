"""``python -m ckpt_ha.cli.alerts --team TEAM --runbook-base URL [--prometheus-rule]``: print
the shipped alert rules with an organisation's team label and runbook address (see
`ckpt_ha.ops.alerts`), as a Prometheus rule file or as a Kubernetes PrometheusRule."""

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
        "--prometheus-rule",
        action="store_true",
        help="print a Kubernetes PrometheusRule (prometheus-operator) instead of a rule file",
    )
    args = parser.parse_args(argv)
    try:
        text = alerts.render(alerts.shipped(), team=args.team, runbook_base=args.runbook_base)
    except alerts.BadAlertSetting as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(prometheus_rule(text) if args.prometheus_rule else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
