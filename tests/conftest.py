from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from compare_jobs import StragglerJobs
from hypothesis import HealthCheck, settings

from policy_engine.runtime.process import state

# No property test may pass or fail by the machine's speed: no per-example deadline and no
# "too slow" health check, whatever else the machine is running (a test's own @settings keep
# these unless they set them).
settings.register_profile("any-machine", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("any-machine")


def _policy(output_dir: str, **role: Any) -> dict[str, Any]:
    body = {"enabled": True, "backend": "torch", "torch": {"activities": ["cpu"]}}
    body.update(role)
    return {"version": 1, "prefix": "t", "output_dir": output_dir, "roles": {"actor": body}}


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    """Each test starts with nothing a process holds: no capture, no one-time warning."""
    yield
    state.reset()


@pytest.fixture(scope="session")
def straggler_jobs(tmp_path_factory: pytest.TempPathFactory) -> StragglerJobs:
    """The 4-rank straggler jobs (compare_jobs.JOBS), each run once per session when a test
    first asks for it; tests only read what they wrote."""
    return StragglerJobs(tmp_path_factory.mktemp("straggler_jobs"))


@pytest.fixture
def make_policy(tmp_path: Any) -> Callable[..., dict[str, Any]]:
    """A one-role (actor) policy writing under tmp_path/out; keyword args go in the role."""
    def make(**role: Any) -> dict[str, Any]:
        return copy.deepcopy(_policy(str(tmp_path / "out"), **role))
    return make


# The fixtures that fetch wheels or packages from an index the first time (then kept under
# $POLICY_ENGINE_CACHE or ~/.cache/policy-engine): a test that uses one, directly or through
# another fixture, is marked `wheels`, so that `-m "not wheels"` leaves out every test that
# may reach the network.
FETCHING = {
    "test_engines_contract.py": {"vllm_src", "sglang_src"},
    "test_torch_npu_contract.py": {"real", "real_old"},
    "test_memory_npu.py": {"real"},
    "test_nsys_e2e.py": {"nsys", "nvtx_path"},
}


# Under pytest-xdist (`-n 2 --dist loadgroup`, as .ci/run runs the tests) each file's tests
# run in one worker, so that a module's or a file's session fixtures are built once; these
# files share a worker with each other: the straggler jobs of one session (conftest's
# straggler_jobs), and one local Ray cluster at a time.
TOGETHER = {
    "test_analyze_e2e.py": "straggler_jobs",
    "test_compare_e2e.py": "straggler_jobs",
    "test_summaries_e2e.py": "straggler_jobs",
    "test_channel_ray.py": "ray",
    "test_distributed.py": "ray",
}


def _group(nodeid: str) -> str:
    """The group of a test: its file's, from :data:`TOGETHER` or the file itself."""
    path = nodeid.split("::", 1)[0]
    return TOGETHER.get(path.rsplit("/", 1)[-1], path)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which makes -n alone `load`
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``-n N`` alone distributes by group (``--dist loadgroup``), as .ci/run asks: test by
    test, the files whose tests share a job or a Ray cluster would race. A ``--dist``
    given on the command line stays; without pytest-xdist nothing changes."""
    if config.getoption("numprocesses", None) and config.getoption("dist", None) == "no" \
            and not config.getoption("distload", False):
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` by :func:`_group`, decided where the tests are handed out.
    pytest-xdist's own loadgroup reads the ``xdist_group`` marks in each worker and tells
    the controller by renaming the test, which pytest 9 no longer lets a plugin do: under
    it every test would be its own group."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return FileGroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker, and before xdist reads groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fetching = FETCHING.get(item.path.name, set())
        if fetching & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.wheels)
        group = TOGETHER.get(item.path.name, item.path.name)
        item.add_marker(pytest.mark.xdist_group(group))
