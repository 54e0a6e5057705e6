"""The README's code and the demo run as documented (in a scratch directory)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python_blocks(markdown: str) -> list[str]:
    """The code of every ```python block (with or without a ``title="..."`` tag)."""
    return re.findall(r"```python(?:[ \t][^\n]*)?\n(.*?)```", markdown, flags=re.DOTALL)


def _needs_langchain(block: str) -> bool:
    return re.search(r"^\s*(?:import|from)\s+ce\.langchain\b", block, flags=re.M) is not None


def _needs_llamaindex(block: str) -> bool:
    return re.search(r"^\s*(?:import|from)\s+ce\.llamaindex\b", block, flags=re.M) is not None


def _needs_autogen(block: str) -> bool:
    return re.search(r"^\s*(?:import|from)\s+ce\.autogen\b", block, flags=re.M) is not None


def _needs_semantic_kernel(block: str) -> bool:
    pattern = r"^\s*(?:import|from)\s+ce\.semantic_kernel\b"
    return re.search(pattern, block, flags=re.M) is not None


def _needs_haystack(block: str) -> bool:
    return re.search(r"^\s*(?:import|from)\s+ce\.haystack\b", block, flags=re.M) is not None


def _needs_crewai(block: str) -> bool:
    return re.search(r"^\s*(?:import|from)\s+ce\.crewai\b", block, flags=re.M) is not None


def _installed(*modules: str) -> bool:
    """Whether every module (and its parent packages) can be imported."""
    for module in modules:
        try:
            if importlib.util.find_spec(module) is None:
                return False
        except ModuleNotFoundError:  # a parent package is missing
            return False
    return True


def test_readme_python_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert blocks, "the README should show how to use ce.core"
    assert any(_needs_langchain(b) for b in blocks), "the README should show ce.langchain"
    assert any(_needs_llamaindex(b) for b in blocks), "the README should show ce.llamaindex"
    # The core virtualenv holds no framework: blocks using ce.langchain / ce.llamaindex run
    # where they are installed (with their framework), and are skipped here otherwise.
    langchain = importlib.util.find_spec("langchain_core") is not None and (
        importlib.util.find_spec("ce.langchain") is not None
    )
    llamaindex = _installed("llama_index.core", "ce.llamaindex")
    autogen = _installed("autogen_agentchat", "ce.autogen")
    semantic_kernel = _installed("semantic_kernel", "ce.semantic_kernel")
    haystack = _installed("haystack", "ce.haystack")
    crewai = _installed("crewai", "ce.crewai")
    monkeypatch.chdir(tmp_path)
    ran = 0
    for block in blocks:
        if _needs_langchain(block) and not langchain:
            continue
        if _needs_llamaindex(block) and not llamaindex:
            continue
        if _needs_autogen(block) and not autogen:
            continue
        if _needs_semantic_kernel(block) and not semantic_kernel:
            continue
        if _needs_haystack(block) and not haystack:
            continue
        if _needs_crewai(block) and not crewai:
            continue
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
        ran += 1
    assert ran, "the README's ce.core example should run everywhere"


def test_core_demo_runs_on_the_default_sqlite_store(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CE_STORE_URL"}
    for _ in range(2):  # a second run starts the demo session afresh
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "core_demo.py")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    assert (tmp_path / ".ce" / "sessions.db").is_file()
    out = done.stdout
    assert "11 messages, 3 tool calls, 3 evidences" in out and "5 turn reports" in out
    assert "degraded ev:" in out and "dropped  ev:" in out
    assert "calls ['weather', 'weather']" in out
    assert "ana@example.com" not in out  # the notebook's e-mail address was redacted
