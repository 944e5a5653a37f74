"""Generate the committed JSON Schemas: ``python -m ckpt_ha.contracts.schema_gen [--check]``.

One file per event type and version (the whole envelope with its payload). A test fails when the
committed files and the models drift apart.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ckpt_ha.contracts.catalog import CATALOG
from ckpt_ha.contracts.envelope import Envelope

SCHEMA_DIR = Path(__file__).parent / "schemas"


def render() -> dict[str, str]:
    out: dict[str, str] = {}
    for (event_type, version), model in sorted(CATALOG.models().items()):
        schema = Envelope[model].model_json_schema()  # type: ignore[valid-type]
        schema["$id"] = f"https://ckpt-ha.invalid/schemas/{event_type}.v{version}.json"
        schema["title"] = model.type_name()
        out[f"{event_type}.v{version}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    rendered = render()
    existing = {p.name: p.read_text() for p in SCHEMA_DIR.glob("*.json")}
    if check:
        if rendered != existing:
            drift = sorted(set(rendered) ^ set(existing)) + sorted(
                n for n in rendered if n in existing and rendered[n] != existing[n]
            )
            print(f"schemas drifted from the models: {', '.join(drift)}", file=sys.stderr)
            return 1
        return 0
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name in set(existing) - set(rendered):
        (SCHEMA_DIR / name).unlink()
    for name, text in rendered.items():
        (SCHEMA_DIR / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
