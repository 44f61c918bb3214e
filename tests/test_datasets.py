"""The prompt sets built from installed packages (draftcore/tools/datasets.py): the workloads where
drafting pays are reproducible and hold what the model should copy."""
from __future__ import annotations

import json

import pytest

from draftcore import InputError
from draftcore.tools.datasets import (AGENT_HISTORY, WORKLOADS, agent_session, humaneval_problems, mtbench_first_turns,
                                      workload_requests)


def test_each_workload_is_reproducible_and_distinct():
    for kind in WORKLOADS:
        first = workload_requests(kind, 5)
        assert first == workload_requests(kind, 5) and len({json.dumps(chat) for chat in first}) == 5
        assert workload_requests(kind, 3) == first[:3]
        assert all(chat[-1]["role"] == "user" for chat in first)


def test_edit_requests_hold_the_whole_function_and_name_one_change():
    for problem, chat in zip(humaneval_problems(), workload_requests("edit", 4)):
        [request] = chat
        code = (problem["prompt"] + problem["canonical_solution"]).strip("\n")
        assert code in request["content"]
        assert f"rename the function `{problem['entry_point']}` to `{problem['entry_point']}_v2`" in request["content"]


def test_agent_requests_are_one_session_sharing_a_tool_schema():
    """Each request: the same system message (the schema), the session's last AGENT_HISTORY
    exchanges answered by JSON calls of the schema's tools, then the next task; request k + 1's
    history is request k's shifted by one exchange, the one request k asked."""
    chats = workload_requests("agent", 6)
    assert len({json.dumps(chat[0]) for chat in chats}) == 1 and chats[0][0]["role"] == "system"
    schema = json.loads(chats[0][0]["content"].split("The tools, as JSON:\n")[1].split("\n\nReply")[0])
    tools = [tool["name"] for tool in schema]
    assert tools == ["search_documentation", "run_python", "write_file"]
    called = set()
    for chat in chats:
        assert len(chat) == 2 + 2 * AGENT_HISTORY
        assert [m["role"] for m in chat[1:]] == ["user", "assistant"] * AGENT_HISTORY + ["user"]
        for message in chat[2:-1:2]:
            call = json.loads(message["content"])
            assert set(call) == {"tool", "arguments"} and call["tool"] in tools
            assert set(call["arguments"]) <= set(schema[tools.index(call["tool"])]["parameters"])
            called.add(call["tool"])
    assert called == set(tools)   # the session's tasks take every tool
    for before, after in zip(chats, chats[1:]):
        assert after[1:-3] == before[3:-1] and after[-3]["content"] == before[-1]["content"]
    questions = mtbench_first_turns()
    assert [task for task, _ in agent_session(9)][::8] == [questions[0], questions[1]]
    with pytest.raises(InputError, match="n: expected 0 to 80 agent exchanges, got 81"):
        agent_session(81)


def test_extract_requests_hold_the_stub():
    for problem, [request] in zip(humaneval_problems(), workload_requests("extract", 4)):
        assert problem["prompt"].strip("\n") in request["content"] and '"parameters"' in request["content"]


def test_an_unknown_workload_is_refused_by_name():
    with pytest.raises(InputError, match="dataset: expected one of .*'edit'.*got 'edits'"):
        workload_requests("edits", 2)
