"""Generate the committed AsyncAPI documents from the service apps.

``python -m ckpt_ha.cli.asyncapi_gen [--check]`` writes the package data
``ckpt_ha/contracts/asyncapi/<service>.json``; the same documents come from
``faststream docs gen --factory ckpt_ha.<svc>.app:asyncapi_app``.
"""

from __future__ import annotations

import json
import sys
from importlib.resources import files
from pathlib import Path

from ckpt_ha.cli.serve import entries

ASYNCAPI_DIR = Path(str(files("ckpt_ha.contracts") / "asyncapi"))


def render() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, entry in entries().items():
        app = entry.asyncapi_app()
        doc = app.schema.to_specification().to_jsonable()
        out[f"{name}.json"] = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    rendered = render()
    existing = {p.name: p.read_text() for p in ASYNCAPI_DIR.glob("*.json")}
    if check:
        if rendered != existing:
            print("AsyncAPI documents drifted from the service apps", file=sys.stderr)
            return 1
        return 0
    ASYNCAPI_DIR.mkdir(exist_ok=True)
    for name, text in rendered.items():
        (ASYNCAPI_DIR / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
