"""ce.core.integration.tool_chains_as_text: tool calls and results as plain assistant text,
for providers that reject tool blocks in a request without tools; peer_turns_as_user: another
agent's turns shown to an agent as that agent's, counted with the budget by the engine."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.errors import BudgetExceededError
from ce.core.formats import from_openai_messages
from ce.core.integration import (
    SentMessages,
    assembled_to_openai,
    openai_key,
    peer_turns_as_user,
    tool_chains_as_text,
)
from ce.core.schema import Author, AuthorKind, Message, Role, ToolCallRequest
from ce.core.stores import SQLiteStore
from ce.core.testing import deterministic_engine
from ce.core.tokens import TiktokenEstimator


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _no_tool_keys(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        assert "tool_calls" not in message and "tool_call_id" not in message
        assert message["role"] != "tool"


def test_a_call_and_its_result_become_one_assistant_text_and_the_input_is_unchanged() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are Writer."},
        {"role": "user", "content": "What is the weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("c1", "weather", {"city": "Paris"})],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny in Paris"},
        {"role": "user", "content": "Write one line."},
    ]
    before = copy.deepcopy(messages)
    out = tool_chains_as_text(messages)
    assert messages == before
    _no_tool_keys(out)
    assert out == [
        {"role": "system", "content": "You are Writer."},
        {"role": "user", "content": "What is the weather?"},
        {
            "role": "assistant",
            "content": '[called weather({"city": "Paris"})]\n[weather returned:]\nsunny in Paris',
        },
        {"role": "user", "content": "Write one line."},
    ]
    assert all(a is not b for a in out for b in messages)


def test_parallel_calls_keep_their_results_and_the_answer_after_joins_them() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Looking both up.",
            "tool_calls": [
                _call("c1", "weather", {"city": "Paris"}),
                _call("c2", "forecast", {"city": "Rome"}),
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "rain in Rome"},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny in Paris"},
        {"role": "assistant", "content": "Paris sunny, Rome rainy."},
        {"role": "user", "content": "Thanks."},
    ]
    out = tool_chains_as_text(messages)
    _no_tool_keys(out)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[1]["content"].split("\n") == [
        "Looking both up.",
        '[called weather({"city": "Paris"})]',
        '[called forecast({"city": "Rome"})]',
        "[forecast returned:]",
        "rain in Rome",
        "[weather returned:]",
        "sunny in Paris",
        "Paris sunny, Rome rainy.",
    ]


def test_messages_without_tool_chains_are_copied_untouched() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "hello", "name": "Writer"},
        {"role": "assistant", "content": "again"},
        {"role": "user", "content": "bye"},
    ]
    out = tool_chains_as_text(messages)
    assert out == messages
    assert all(a is not b for a, b in zip(out, messages, strict=True))
    assert tool_chains_as_text([]) == []


def test_a_result_without_its_call_and_list_contents_are_text() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "tool", "tool_call_id": "lost", "name": "search", "content": "a hit"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Calling."}],
            "tool_calls": [_call("c3", "lookup", {})],
        },
        {"role": "tool", "tool_call_id": "c3", "content": [{"type": "text", "text": "found"}]},
    ]
    out = tool_chains_as_text(messages)
    _no_tool_keys(out)
    assert out == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "[search returned:]\na hit\nCalling.\n[called lookup({})]\n"
            "[lookup returned:]\nfound",
        },
    ]


def _sent(messages: list[dict[str, Any]], authors: list[Author | None]) -> SentMessages:
    return SentMessages(messages, [openai_key(m) for m in messages], authors)


RESEARCHER = Author(kind=AuthorKind.AGENT, id="Researcher")
WRITER = Author(kind=AuthorKind.AGENT, id="Writer")


def test_another_agents_turn_goes_as_that_agents_user_message_and_its_own_as_it_was() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are Writer."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("c1", "weather", {"city": "Paris"})],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny in Paris"},
        {"role": "assistant", "content": "Paris is sunny."},
        {"role": "user", "content": "Write one line."},
        {"role": "assistant", "content": "Sunny Paris today."},
        {"role": "user", "content": "Shorter?"},
    ]
    authors: list[Author | None] = [None, None, RESEARCHER, RESEARCHER, RESEARCHER, None, WRITER]
    sent = _sent(messages, [*authors, None])
    before = copy.deepcopy(messages)
    out = peer_turns_as_user(sent, "Writer")
    assert sent == before  # the input is not changed
    assert [m["role"] for m in out] == ["system", "user", "user", "user", "assistant", "user"]
    assert out[2]["content"] == (
        "[Researcher wrote:]\n"
        '[called weather({"city": "Paris"})]\n'
        "[weather returned:]\nsunny in Paris\n"
        "Paris is sunny."
    )
    _no_tool_keys(out)
    assert out[4] == messages[6]  # the writer's own turn
    # the researcher reads the same input with its own turns as they were, the writer's as
    # the writer's
    mine = peer_turns_as_user(sent, "Researcher")
    assert mine[2:5] == messages[2:5]
    assert mine[6] == {"role": "user", "content": "[Writer wrote:]\nSunny Paris today."}


def test_an_agent_continuing_its_tool_loop_reads_its_open_chain_after_the_peers_turns() -> None:
    """Two agents running at once: the researcher answered while the writer ran its tool.
    The writer's next call reads the researcher's turn before its own open chain, which ends
    its input; once the writer has answered, or the user spoke after the chain, the order is
    the session's."""
    call = {"role": "assistant", "content": None, "tool_calls": [_call("w1", "lookup", {})]}
    result = {"role": "tool", "tool_call_id": "w1", "content": "found"}
    peer = {"role": "assistant", "content": "Researcher is done."}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are Writer."},
        {"role": "user", "content": "Weather in Oslo?"},
        call,
        result,
        peer,
    ]
    authors: list[Author | None] = [None, None, WRITER, WRITER, RESEARCHER]
    out = peer_turns_as_user(_sent(messages, authors), "Writer")
    assert out == [
        messages[0],
        messages[1],
        {"role": "user", "content": "[Researcher wrote:]\nResearcher is done."},
        call,
        result,
    ]
    # the researcher itself reads the session's order (its own turn is no open chain)
    mine = peer_turns_as_user(_sent(messages, authors), "Researcher")
    assert [m["role"] for m in mine] == ["system", "user", "user", "assistant"]
    assert mine[2]["content"].startswith("[Writer wrote:]")
    assert mine[3] == peer
    answered = [*messages[:4], {"role": "assistant", "content": "Oslo is sunny."}, peer]
    out = peer_turns_as_user(_sent(answered, [*authors[:4], WRITER, RESEARCHER]), "Writer")
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "assistant", "user"]
    spoke = [*messages, {"role": "user", "content": "Hurry."}]
    out = peer_turns_as_user(_sent(spoke, [*authors, None]), "Writer")
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "user", "user"]
    assert out[-1] == {"role": "user", "content": "Hurry."}


def test_without_authors_or_with_a_users_the_messages_go_as_they_are() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
    ]
    assert peer_turns_as_user(messages, "Writer") == messages  # a plain list: no authors
    user = Author(kind=AuthorKind.USER, id="alice")
    assert peer_turns_as_user(_sent(messages, [user, None]), "Writer") == messages
    out = peer_turns_as_user(_sent(messages, [None, RESEARCHER]), "Writer")
    assert out[1] == {"role": "user", "content": "[Researcher wrote:]\nHello."}
    assert out[0] is not messages[0]  # fresh dicts


def test_the_engines_input_names_who_wrote_each_recorded_turn(tmp_path: Any) -> None:
    engine = ContextEngine(store=SQLiteStore(str(tmp_path / "s.db")))
    pending = [
        Message(role=Role.USER, content="What is the weather in Paris?"),
        Message(role=Role.ASSISTANT, content="Paris is sunny.", author=RESEARCHER),
        Message(role=Role.USER, content="Write one line."),
    ]
    result = engine.sync.prepare_call("s", pending)
    sent = assembled_to_openai(result.assembled_input)
    assert sent.authors == [part.author for part in result.assembled_input.parts]
    by_text = {m["content"]: a for m, a in zip(sent, sent.authors, strict=True)}
    assert by_text["Paris is sunny."] == RESEARCHER
    assert by_text["Write one line."] is None
    out = peer_turns_as_user(sent, "Writer")
    assert {"role": "user", "content": "[Researcher wrote:]\nParis is sunny."} in out
    engine.sync.close()


_AGENTS = ("Researcher", "Analyst", "Writer")


@settings(max_examples=60, deadline=None)
@given(
    turns=st.lists(
        st.tuples(
            st.sampled_from(_AGENTS),
            st.integers(min_value=1, max_value=4),  # sentences of the answer
            st.sampled_from([0, 0, 0, 1, 2]),  # tool calls before it
        ),
        min_size=1,
        max_size=24,
    ),
    budget=st.integers(min_value=150, max_value=900),
)
async def test_every_agent_reads_a_shared_session_within_the_budget(
    turns: list[tuple[str, int, int]], budget: int
) -> None:
    """A session three agents write (answers, tool calls and their results): each agent's
    reading of the engine's input (the others' turns as ``[<agent> wrote:]`` user messages,
    its own as they are, or its own tool chains as text too for a call without tools) fits
    the budget, tool schemas counted."""
    config = RuntimeConfig(
        model_hint="gpt-4o",
        budget=BudgetConfig(max_input_tokens=budget + 1_024, reserved_reply_tokens=1_024),
    )
    engine = deterministic_engine(config)
    estimator = TiktokenEstimator()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    history: list[Message] = []
    for n, (agent, sentences, calls) in enumerate(turns):
        author = Author(kind=AuthorKind.AGENT, id=agent)
        history.append(Message(role=Role.USER, content=f"Task {n} for the {agent.lower()}."))
        for c in range(calls):
            call_id = f"call_{n}_{c}"
            history.append(
                Message(
                    role=Role.ASSISTANT,
                    content="",
                    tool_calls=[ToolCallRequest(tool_call_id=call_id, name="lookup", arguments={})],
                    author=author,
                )
            )
            history.append(
                Message(role=Role.TOOL, content=f"lookup result {n}.{c}", tool_call_id=call_id)
            )
        answer = " ".join(f"Point {n}.{s} of the {agent.lower()}." for s in range(sentences))
        history.append(Message(role=Role.ASSISTANT, content=answer, author=author))
    history.append(Message(role=Role.USER, content="Next task."))
    try:
        result = await engine.prepare_call("s", history, tool_schemas=tools)
    except BudgetExceededError:
        return  # the must blocks alone over the budget: nothing is sent
    sent = assembled_to_openai(result.assembled_input)
    schemas = estimator.estimate_tools(tools, "gpt-4o")
    for agent in _AGENTS:
        read = peer_turns_as_user(sent, agent)
        parts = from_openai_messages(read)
        assert sum(estimator.estimate_part(p, "gpt-4o") for p in parts) + schemas <= budget
        # a call of that agent that passes no tools: its own chains as text as well
        flat = from_openai_messages(tool_chains_as_text(read))
        assert sum(estimator.estimate_part(p, "gpt-4o") for p in flat) + schemas <= budget
