"""``python -m ce.core.schema [PATH]``: print the JSON Schema, or write it to PATH."""

from __future__ import annotations

import sys
from pathlib import Path

from ce.core.schema._io import json_schema_text


def main(argv: list[str]) -> int:
    text = json_schema_text()
    if argv:
        Path(argv[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
