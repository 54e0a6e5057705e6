"""``ce.langchain.wrap(model)``, the explicit seam without the global patch: LangChain's
standard chat-model unit tests, the engine's input on invoke / ainvoke / stream / astream,
tool schemas counted against the budget, usage recorded once, and a create_agent tool loop."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import SYSTEM, USAGE, BindingFake, get_weather, replying
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, SystemMessage
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver

import ce.langchain
from ce.core.engine import ContextEngine
from ce.langchain import LangChainPlugin
from ce.langchain._wrap import ContextEngineChatModel


def make_inner(*replies: AIMessage | str) -> BindingFake:
    return (
        replying(*replies)
        if replies
        else replying(AIMessage(content="hello there", usage_metadata=USAGE))
    )


# -- LangChain's standard unit tests ------------------------------------------------------

try:
    from langchain_tests.unit_tests import ChatModelUnitTests
except ImportError:  # pragma: no cover - langchain-tests is in the tests-langchain session
    ChatModelUnitTests = None


if ChatModelUnitTests is not None:

    class TestWrappedChatModelStandard(ChatModelUnitTests):  # type: ignore[misc]
        """langchain-tests' ``ChatModelUnitTests`` against ``wrap(fake)``."""

        @property
        def chat_model_class(self) -> type[BaseChatModel]:
            return ContextEngineChatModel

        @property
        def chat_model_params(self) -> dict[str, Any]:
            return {"inner": make_inner(*(["ok"] * 20))}

        @property
        def has_tool_calling(self) -> bool:
            return True

else:  # pragma: no cover

    @pytest.mark.skip(reason="langchain-tests is not installed")
    def test_wrapped_chat_model_standard() -> None:
        pass


# -- injection ----------------------------------------------------------------------------


async def _call(path: str, model: Runnable[Any, Any], messages: list[Any]) -> str:
    config: Any = {"metadata": {"ce_session_id": "w"}}
    if path == "invoke":
        return str(model.invoke(messages, config).content)
    if path == "ainvoke":
        return str((await model.ainvoke(messages, config)).content)
    if path == "stream":
        return "".join(str(c.content) for c in model.stream(messages, config))
    return "".join([str(c.content) async for c in model.astream(messages, config)])


@pytest.mark.parametrize("path", ["invoke", "ainvoke", "stream", "astream"])
async def test_wrap_injects_on_every_path_without_the_global_patch(
    path: str, engine: ContextEngine
) -> None:
    original = BaseChatModel.__dict__["_convert_input"]
    inner = make_inner()
    model = ce.langchain.wrap(inner, engine)
    assert isinstance(model, ContextEngineChatModel)
    assert LangChainPlugin().installed
    assert BaseChatModel.__dict__["_convert_input"] is original  # nothing patched
    await engine.update_notebook("w", "NOTEBOOK-MARK")

    answer = await _call(path, model, [SystemMessage(SYSTEM), ("user", "weather?")])
    assert answer.replace(" ", "") == "hellothere"
    (sent,) = inner.seen
    assert [m.type for m in sent] == ["system", "human"]
    assert SYSTEM in str(sent[0].content) and "NOTEBOOK-MARK" in str(sent[0].content)
    doc = await engine.get_session("w")
    assert [m.content for m in doc.session.messages if m.role.value == "user"] == ["weather?"]
    assert [m.content for m in doc.session.messages if m.role.value == "assistant"] == [
        "hello there"
    ]
    assert len(await engine.list_turns("w")) == 1
    if path in ("invoke", "ainvoke"):  # streamed fake chunks carry no usage
        usage = doc.session.model_usage
        assert [(u.prompt_tokens, u.completion_tokens) for u in usage] == [(11, 5)]


async def test_wrap_bind_tools_counts_the_schemas_against_the_budget(
    engine: ContextEngine,
) -> None:
    plain_inner, tools_inner = make_inner(), make_inner()
    ce.langchain.wrap(plain_inner, engine).invoke(
        [("user", "hi")], {"metadata": {"ce_session_id": "plain"}}
    )
    bound = ce.langchain.wrap(tools_inner, engine).bind_tools([get_weather], tool_choice="auto")
    bound.invoke([("user", "hi")], {"metadata": {"ce_session_id": "tools"}})

    # the wrapped model got its own provider-format kwargs, not the wrapper's bookkeeping
    (kwargs,) = tools_inner.seen_kwargs
    assert [t["function"]["name"] for t in kwargs["tools"]] == ["get_weather"]
    assert kwargs["tool_choice"] == "auto"
    assert "ce_bound_tools" not in kwargs
    (plain_turn,) = await engine.list_turns("plain")
    (tools_turn,) = await engine.list_turns("tools")
    assert plain_turn.report is not None and tools_turn.report is not None
    schemas = [convert_to_openai_tool(get_weather)]
    cost = engine.estimator.estimate_tools(schemas, "gpt-4o")
    assert cost > 0
    assert plain_turn.report.token_budget - tools_turn.report.token_budget == cost


async def test_wrap_with_the_global_patch_injects_once(engine: ContextEngine) -> None:
    ce.langchain.install(engine, session_id="both")
    await engine.update_notebook("both", "NOTEBOOK-MARK")
    inner = make_inner()
    ce.langchain.wrap(inner).invoke([SystemMessage(SYSTEM), ("user", "hi")])
    (sent,) = inner.seen
    assert str(sent[0].content).count("NOTEBOOK-MARK") == 1
    assert len(await engine.list_turns("both")) == 1


async def test_wrap_passes_through_when_skipped_or_uninstalled(engine: ContextEngine) -> None:
    inner = make_inner(*(["ok"] * 3))
    model = ce.langchain.wrap(inner, engine, session_id="skip")
    await engine.update_notebook("skip", "NOTEBOOK-MARK")
    model.with_config(tags=["ce:skip"]).invoke([("user", "tagged")])
    LangChainPlugin().uninstall()
    model.invoke([("user", "after uninstall")])
    assert [[m.type for m in seen] for seen in inner.seen] == [["human"], ["human"]]
    assert await engine.list_turns("skip") == []


@pytest.mark.parametrize("use_async", [False, True])
async def test_wrapped_model_in_create_agent_injects_every_call(
    use_async: bool, engine: ContextEngine
) -> None:
    inner = make_inner(
        AIMessage(
            content="",
            tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_w"}],
            usage_metadata=USAGE,
        ),
        AIMessage(content="Paris is sunny.", usage_metadata=USAGE),
    )
    agent = create_agent(
        ce.langchain.wrap(inner, engine),
        tools=[get_weather],
        system_prompt=SYSTEM,
        checkpointer=InMemorySaver(),
    )
    await engine.update_notebook("agent", "NOTEBOOK-MARK")
    config: Any = {"configurable": {"thread_id": "agent"}}
    inputs = {"messages": [("user", "weather in Paris?")]}
    result = await agent.ainvoke(inputs, config) if use_async else agent.invoke(inputs, config)
    assert result["messages"][-1].content == "Paris is sunny."
    first, second = inner.seen
    assert "NOTEBOOK-MARK" in str(first[0].content) and "NOTEBOOK-MARK" in str(second[0].content)
    assert [m.type for m in second] == ["system", "human", "ai", "tool"]
    assert all(k["tools"][0]["function"]["name"] == "get_weather" for k in inner.seen_kwargs)
    # the graph state keeps the app's own messages
    assert [m.type for m in result["messages"]] == ["human", "ai", "tool", "ai"]
    turns = await engine.list_turns("agent")
    assert len(turns) == 2
    assert all(t.report is not None and t.report.token_budget > 0 for t in turns)
    doc = await engine.get_session("agent")
    assert len(doc.session.model_usage) == 2
