"""The flat public namespace: ``from ce.core import ...`` gives what an application uses."""

from __future__ import annotations

import ce.core
from ce.core import BudgetConfig, ContextEngine, Message, Role, RuntimeConfig, open_store
from ce.core.engine import ContextEngine as EngineFromModule


def test_every_public_name_resolves_to_the_modules_object() -> None:
    assert sorted(ce.core.__all__) == ce.core.__all__
    for name in ce.core.__all__:
        assert getattr(ce.core, name) is not None, name
    assert ContextEngine is EngineFromModule


async def test_the_flat_names_work_together() -> None:
    engine = ContextEngine(
        open_store("memory://"),
        config=RuntimeConfig(model_hint="gpt-4o", budget=BudgetConfig(max_input_tokens=2000)),
    )
    prepared = await engine.prepare_turn("s", Message(role=Role.USER, content="hi"))
    assert prepared.assembled_input.parts[-1].content == "hi"
    await engine.close()
