"""examples/crewai_crew.py: every request carries the session's notebook, the store holds the
tasks with their dependency, the tool run with its task and usage per task; and the script
runs as the docs say (offline, in a scratch directory)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "crewai_crew.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("crewai_crew", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_the_example_crew(example: ModuleType, engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(example.script) as server:
        answer = await example.run(engine, server)
        requests = server.requests
    assert answer == "Pack sunglasses: Paris is sunny and 21 C."
    assert len(requests) == 3
    assert all("prefers short answers" in json.dumps(r["messages"]) for r in requests)
    doc = await engine.get_session(example.SESSION)
    assert doc is not None
    tasks = {t.name: t for t in doc.session.task_state.todo_list.tasks}
    assert tasks["brief"].depends_on == [tasks["research"].task_id]
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool_call_id, run.task_id) == ("call_weather", tasks["research"].task_id)
    assert {u.task_id for u in doc.session.model_usage} == {t.task_id for t in tasks.values()}


def test_the_script_runs_offline(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CE_STORE_URL"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Pack sunglasses" in done.stdout
    assert (tmp_path / ".ce" / "sessions.db").is_file()
