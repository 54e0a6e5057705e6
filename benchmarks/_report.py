"""What the benchmark scripts share: the machine line and writing their section of a doc."""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["cpu_model", "write_section"]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_section(path: Path, name: str, section: str) -> None:
    """Replace the part of ``path`` between ``<!-- bench:NAME:start -->`` and its end marker
    with ``section`` (appending it when the markers are missing); the rest stays."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{section}{end}\n"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
