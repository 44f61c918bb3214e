"""draftcore's tooling: the benchmark harness, datasets, trace recording and replay, the CLI.

Depends on the runtime (`draftcore`), never the other way round; backends are found through
`draftcore.tools.backends` (entry points), so nothing here names an adapter.
"""
