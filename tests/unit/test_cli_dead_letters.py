"""`ckpt-ha dead-letters replay`'s arguments: a bad one is one line on stderr and exit 2, before
anything connects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ckpt_ha.cli.main import main
from ckpt_ha.cli.parser import build_parser


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--reason", "Max Deliver"], "is not an error code"),
        (["--reason", ""], "is not an error code"),
        (["--since", "yesterday"], "neither an ISO 8601 time nor an age"),
        (["--since", "2999-01-01T00:00:00+00:00"], "is in the future"),
        (["--since=-2h"], "neither an ISO 8601 time nor an age"),
        (["--consumer", " "], "must be non-empty text on one line"),
        (["--limit", "3"], "unrecognized arguments"),
    ],
)
def test_bad_replay_arguments_are_one_line_and_exit_2(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dead-letters", "replay", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("ckpt-ha: ")
    assert says in err


def test_since_takes_an_age_or_a_time_utc_unless_it_names_a_zone() -> None:
    parse = build_parser().parse_args
    before = datetime.now(UTC)
    two_hours = parse(["dead-letters", "replay", "--since", "2h"]).since
    assert before - timedelta(hours=2, seconds=5) < two_hours <= datetime.now(UTC)
    naive = parse(["dead-letters", "replay", "--since", "2026-01-02T03:04:05"]).since
    assert naive == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    zoned = parse(["dead-letters", "replay", "--since", "2026-01-02T03:04:05+02:00"]).since
    assert zoned == datetime(2026, 1, 2, 1, 4, 5, tzinfo=UTC)
    listing = parse(["dead-letters", "--limit", "5"])
    assert (listing.action, listing.limit) == (None, 5)
