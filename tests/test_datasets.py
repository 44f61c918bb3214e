"""The prompt sets built from installed packages (draftcore/tools/datasets.py): the workloads where
drafting pays are reproducible and hold what the model should copy."""
from __future__ import annotations

import json

import pytest

from draftcore import InputError
from draftcore.tools.datasets import WORKLOADS, humaneval_problems, mtbench_first_turns, workload_requests


def test_each_workload_is_reproducible_and_distinct():
    for kind in WORKLOADS:
        first = workload_requests(kind, 5)
        assert first == workload_requests(kind, 5) and len(set(first)) == 5
        assert workload_requests(kind, 3) == first[:3]


def test_edit_requests_hold_the_whole_function_and_name_one_change():
    for problem, request in zip(humaneval_problems(), workload_requests("edit", 4)):
        code = (problem["prompt"] + problem["canonical_solution"]).strip("\n")
        assert code in request
        assert f"rename the function `{problem['entry_point']}` to `{problem['entry_point']}_v2`" in request


def test_agent_requests_share_one_tool_schema():
    requests = workload_requests("agent", 4)
    schemas = {r.split("The tools, as JSON:\n")[1].split("\n\nTask:")[0] for r in requests}
    assert len(schemas) == 1
    assert [tool["name"] for tool in json.loads(schemas.pop())] == ["search_documentation", "run_python",
                                                                    "write_file"]
    for question, request in zip(mtbench_first_turns(), requests):
        assert question in request


def test_extract_requests_hold_the_stub():
    for problem, request in zip(humaneval_problems(), workload_requests("extract", 4)):
        assert problem["prompt"].strip("\n") in request and '"parameters"' in request


def test_an_unknown_workload_is_refused_by_name():
    with pytest.raises(InputError, match="dataset: expected one of .*'edit'.*got 'edits'"):
        workload_requests("edits", 2)
