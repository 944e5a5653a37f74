"""What a command is and how it fails, kept apart from `context` (which builds server-side
clients) so that the offline commands run on the light install."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

Handler = Callable[[argparse.Namespace, dict[str, str], Path], int]
"""A command: its parsed arguments, the environment, the ckpt-ha home; returns the exit code."""


class CommandError(Exception):
    """A failure to report in one line (exit 1)."""
