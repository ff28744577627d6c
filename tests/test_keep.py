"""``keep: summaries``: a torch trace is removed once its summary is written whole, kept
when the summary failed; ``limits.bytes`` counts what stays; the setting is checked like
every other."""

from __future__ import annotations

import gzip
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from policy_engine import PolicyError, Topology, load_policy, profile_session
from policy_engine.analysis import summarize
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.files.records import trace_line
from policy_engine.plan.predict import explain
from policy_engine.runtime.process import export, manifest, summaries
from policy_engine.runtime.process.budget import spend_of


def records(out: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(out)).records if r["event"] == event]


def run(policy: dict[str, Any], steps: tuple[int, ...]) -> None:
    """A loop whose summaries are written before each next step (so that the bytes a
    removed trace gives back are back when the next capture asks)."""
    prof = profile_session(policy, "actor", Topology())
    model = torch.nn.Linear(32, 32)
    for n in steps:
        with prof.training_step(n):
            for _ in range(2):
                model(torch.randn(4, 32)).sum().backward()
                prof.step()
        export.flush()
        assert summaries.wait(60)
    prof.close()
    assert summaries.wait(60)


def test_the_trace_goes_once_its_summary_is_written(make_policy: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(make_policy(steps=[1, 2], keep="summaries"), (1, 2))
    traces, found = records(out, "trace"), records(out, "summary")
    assert len(traces) == len(found) == 2
    for trace, line in zip(sorted(traces, key=lambda r: r["path"]),
                           sorted(found, key=lambda r: r["path"]), strict=True):
        assert (line["path"], line["status"], line["kept"]) == (trace["path"], "complete", False)
        assert not (out / trace["path"]).exists()
        assert line["summary"]["bytes"] == trace["bytes"]  # the figures of the file it was
    assert list(out.rglob("*.pt.trace.json*")) == []


def test_a_trace_whose_summary_failed_stays(tmp_path: Path) -> None:
    out = tmp_path / "out"
    path = out / "actor" / "t.pt.trace.json.gz"
    path.parent.mkdir(parents=True)
    data = gzip.compress(b'{"traceEvents": [')  # cut short: no summary can be made of it
    path.write_bytes(data)
    line = trace_line({"role": "actor", "rank": 0}, capture="1-1", status="complete",
                      path="actor/t.pt.trace.json.gz", bytes=len(data))
    manifest.append(str(out), line)
    summaries.order(str(out), line, str(path), keep="summaries", budget=None)
    assert summaries.wait(60)
    [found] = records(out, "summary")
    assert (found["status"], found["kept"]) == ("failed", True)
    assert found["error"] == summarize(str(path))["error"]
    assert path.read_bytes() == data


@pytest.mark.parametrize(("keep", "captured"), [("traces", 1), ("summaries", 3)])
def test_limits_bytes_counts_what_stays(make_policy: Any, tmp_path: Path, keep: str,
                                        captured: int) -> None:
    # Any trace passes one byte: keeping traces, the first one spends the budget; keeping
    # summaries, each trace's bytes come back once it is removed.
    run(make_policy(steps=[1, 2, 3], keep=keep, limits={"bytes": 1}), (1, 2, 3))
    out = tmp_path / "out"
    traces = [r for r in records(out, "trace") if r.get("path")]
    assert len(traces) == captured
    stays = sum(r["bytes"] for r in traces if (out / r["path"]).exists())
    assert spend_of("actor").bytes == stays == (traces[0]["bytes"] if keep == "traces" else 0)
    assert [n["note"] for n in records(out, "note")] == (["limit"] if keep == "traces" else [])


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(("value", "message"), [
    ("summary", "keep must be one of traces, summaries, got 'summary' (did you mean "
                "'summaries'?)"),
    ("[traces]", 'keep must be one of traces, summaries, got ["traces"]'),
    ("3", "keep must be one of traces, summaries, got 3"),
])
def test_a_bad_value_is_an_error_at_its_place(tmp_path: Path, value: str, message: str) -> None:
    path = write(tmp_path, f"""\
        version: 1
        roles:
          actor:
            enabled: true
            keep: {value}
        """)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert f"{path}:5:11: error: {message} (at $.roles.actor.keep)" in str(caught.value)


def test_a_bad_value_leaves_the_other_checks_of_its_role(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        version: 1
        roles:
          actor: {enabled: true, ranks: all, steps: [1], name: "t", keep: everything}
        """)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert [p.json_path for p in caught.value.problems] == [
        "$.roles.actor.name", "$.roles.actor.keep"]  # in the order of the file


def test_keep_summaries_without_torch_is_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        version: 1
        defaults: {keep: summaries, steps: [1]}
        roles:
          actor: {enabled: true, backend: [torch, memory]}
          rollout: {enabled: true, backend: nsight}
        """)
    policy = load_policy(path)
    assert [(w.json_path, w.message) for w in policy.warnings] == [
        ("$.defaults.keep", "keep: summaries keeps every trace of role 'rollout': summaries "
                            "are made of torch traces only, and its backend is nsight")]
    assert policy.role("actor").keep == policy.role("rollout").keep == "summaries"
    assert policy.role("ref").keep == "summaries"  # a role the policy does not name
    with pytest.raises(PolicyError, match="keep: summaries keeps every trace"):
        load_policy(path, strict=True)


def test_colocated_roles_keep_alike(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        version: 1
        colocate: [[actor, ref]]
        defaults: {steps: [1]}
        roles:
          actor: {enabled: true, keep: summaries}
          ref: {enabled: true}
        """)
    with pytest.raises(PolicyError, match=r"differ in keep \('summaries' and 'traces'\)"):
        load_policy(path)


def test_the_plan_and_explain_say_it(make_policy: Any) -> None:
    policy = load_policy(make_policy(keep="summaries", steps=[1]))
    entry = explain(policy, "actor", world=1)["ranks"][0]
    assert entry["keep"] == "summaries"
    assert "keep" not in explain(load_policy(make_policy(steps=[1])), "actor",
                                 world=1)["ranks"][0]


def test_explain_text_says_traces_are_removed(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from policy_engine.cli.main import main

    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nroles:\n  actor:\n    enabled: true\n    steps: [1]\n"
                    "    keep: summaries\n")
    assert main(["explain", str(path), "--role", "actor", "--world", "1"]) == 0
    assert "keep: summaries (each torch trace listed is removed once its rank has " \
           "summarised it" in capsys.readouterr().out
    path.write_text("version: 1\nroles:\n  actor:\n    enabled: true\n    steps: [1]\n")
    assert main(["explain", str(path), "--role", "actor", "--world", "1"]) == 0
    assert "keep:" not in capsys.readouterr().out
