"""draftcore's tooling: the benchmark harness, datasets, trace recording and replay, the CLI, the
benchmarks' tables and reports (report.py) and the results page rendered from them (results.py), and
every harness that drives a backend.

Depends on the runtime (`draftcore`) and the adapters, never the other way round: the runtime and
the adapters import nothing from here. Only backends/ names adapters (each backend's bench hooks,
`make demo`, the vLLM engines); the modules here find backends through `draftcore.tools.backends`
(entry points), so a third-party backend plugs in the same way. variants.py registers the drafter
variants kept for measurement. The models and references that tests and benchmarks share live in
tests/fixtures, outside the installed package.
"""
