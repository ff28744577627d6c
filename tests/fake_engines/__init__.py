"""Stand-ins for vLLM and SGLang: the same profiler signatures, request fields, routes and
file names as the real engines (tests/test_engines_contract.py compares them with the
wheels' sources), writing small Chrome traces where the engines write real ones."""
