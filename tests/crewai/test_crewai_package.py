"""The supported range: one source (``ce.crewai.package``) for the pyproject extra, the
install-time check and the nox lowest session."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ce.core.integration import requirement_conflicts
from ce.crewai.package import LOWEST, REQUIREMENTS

ROOT = Path(__file__).resolve().parents[2]


def test_the_supported_range_is_the_pyproject_extra_and_is_installed() -> None:
    pyproject = (ROOT / "packages/ce-crewai/pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^crewai = (\[.*\])$", pyproject, flags=re.M)
    assert extra is not None, "the crewai extra is missing"
    assert tuple(ast.literal_eval(extra.group(1))) == REQUIREMENTS
    assert requirement_conflicts(REQUIREMENTS) == []
    assert requirement_conflicts(tuple(f"{k}>={v}" for k, v in LOWEST.items())) == []
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    for name, version in LOWEST.items():
        assert re.search(rf'"{re.escape(name)}=={re.escape(version)}"', noxfile), name
