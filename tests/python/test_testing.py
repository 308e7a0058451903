"""test_testing.py - python/attnfuzz/testing.py without the tools: reading report.json, the failure message, no eval."""

import ast
import json
import os
import sys

import pytest

from attnfuzz import testing

# A failure as attn-check's report.json writes it (report/report_json.cpp): verdict in lower case, the
# evidence in run order, the deciding detector's line late and a closing classify line.
EVIDENCE = [
    {"detector": "compare", "detail": "412 of 1280 elements beyond the bound"},
    {"detector": "flash-rule", "detail": "kernel max |err| 3.1 vs 2 x fp32 reference 1e-7: beyond"},
    {"detector": "rows", "detail": "8 rows with keys and finite O beyond the bound"},
    {"detector": "reruns", "detail": "not run on the cpu backend"},
    {"detector": "poison-swap", "detail": "rerun identical; swap changes nothing"},
    {"detector": "schedule", "detail": "forward, reverse, shuffle 11, 12: identical bits"},
    {"detector": "mask", "detail": "no mask variant matches"},
    {"detector": "empty-row", "detail": "no empty row"},
    {"detector": "split-kv", "detail": "no declared split knob"},
    {"detector": "tail", "detail": "every padding still fails"},
    {"detector": "lse", "detail": "O is beyond its bound: not an lse failure"},
    {"detector": "reorder", "detail": "max key first: pass (err/bound 0.01); max key last: FAIL (err/bound 4e3): "
                                      "the running max is not rescaled"},
    {"detector": "precision", "detail": "max err/bound 4e3"},
    {"detector": "classify", "detail": "rescale by reorder (2 extra launch(es), 2 extra oracle(s), 31 ms)"},
]
FAIL = {"kernel": "planted-no-acc-rescale", "case_text": "B=1 Hq=2 Hkv=1 Sq=33 Sk=100 D=32", "verdict": "fail",
        "class": "rescale", "reason": "412 elements beyond the bound", "evidence": EVIDENCE,
        "replay": "attn-check --replay reports/corpus/rescale-0123456789abcdef.case"}


def write_report(tmp_path, results):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"schema": "attnfuzz-report", "results": results}))
    return str(path)


def test_failures_are_the_results_whose_verdict_is_fail(tmp_path):
    unclassified = dict(FAIL, **{"class": None})  # the verdict decides, not the presence of a class
    results = [{"verdict": "pass", "class": None}, {"verdict": "unsupported", "class": None}, unclassified,
               {"verdict": "outside-contract", "class": None}]
    assert testing._failures(write_report(tmp_path, results)) == [unclassified]


def test_the_deciding_detectors_evidence_comes_first_and_is_never_cut():
    text = testing._describe(FAIL).split("\n")
    assert text[0].startswith("  [rescale] planted-no-acc-rescale:")
    assert text[2].startswith("    reorder: max key first: pass")
    assert text[2].endswith("the running max is not rescaled")
    assert text[3].startswith("    classify: rescale by reorder")
    assert text[-1] == "    replay: attn-check --replay reports/corpus/rescale-0123456789abcdef.case"
    assert any("more evidence line(s) in report.json" in line for line in text)


def test_a_class_from_the_check_itself_shows_the_canary_first():
    r = dict(FAIL, **{"class": "oob-write", "evidence": [
        {"detector": "compare", "detail": "all within bound"}] * 8 + [
        {"detector": "canary", "detail": "o: guard word at byte offset 4096 changed"}]})
    assert testing._describe(r).split("\n")[2] == "    canary: o: guard word at byte offset 4096 changed"


def test_the_failure_message_lists_the_decisive_line(tmp_path):
    report_dir = tmp_path / "sweep"
    report_dir.mkdir()
    write_report(report_dir, [FAIL])
    assert "reorder: max key first" in "\n".join(testing._describe(r) for r in
                                                  testing._failures(str(report_dir / "report.json")))


def test_no_eval_in_the_module():
    tree = ast.parse(open(testing.__file__).read())
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert "eval" not in calls and "exec" not in calls


def test_the_child_path_is_read_as_json(monkeypatch, tmp_path):
    extra = str(tmp_path / "my-tests")
    os.makedirs(extra)
    monkeypatch.setattr(testing, "_default_path", None)
    monkeypatch.setattr(sys, "path", sys.path + [extra])
    assert extra in testing._extra_path()
    assert testing._default_path, "the child interpreter's sys.path was not read"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
