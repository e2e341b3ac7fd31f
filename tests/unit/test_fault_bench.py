"""bench/fault_tolerance.py's reading of the fault tests' junit report: a test that
failed before its fault is counted apart from a fault that was not survived."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("bench/fault_tolerance.py")


def _ledger(fault: str, completed: bool = True) -> str:
    ledger = {"fault": fault, "completed": completed, "error": None, "resumed": False}
    return json.dumps(ledger | {"rows_lost": 0, "rows_duplicated": 0})


def _report(tmp_path: Path) -> Path:
    """Four cases: survived; failed after its fault with no ledger; failed before its
    fault; and a ledger recorded by a test that then failed."""
    ok = _ledger("worker killed").replace('"', "&quot;")
    bad = _ledger("replica killed", completed=False).replace('"', "&quot;")
    junit = tmp_path / "report.xml"
    junit.write_text(
        f"""<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="t" name="test_worker"><properties>
  <property name="fault_injected" value="true"/><property name="fault" value="{ok}"/>
</properties></testcase>
<testcase classname="t" name="test_rank"><properties>
  <property name="fault_injected" value="true"/></properties><failure message="x"/></testcase>
<testcase classname="t" name="test_node"><failure message="no node"/></testcase>
<testcase classname="t" name="test_replica"><properties>
  <property name="fault_injected" value="true"/><property name="fault" value="{bad}"/>
</properties><failure message="y"/></testcase>
</testsuite></testsuites>"""
    )
    return junit


def test_a_test_that_failed_before_its_fault_is_counted_apart(bench, tmp_path):
    records = bench._fault_records(bench._cases(_report(tmp_path)))
    by_test = {record["test"]: record for record in records}
    assert [by_test[f"t::{name}"]["survived"] for name in ("test_worker", "test_rank")] == [
        True,
        False,
    ]
    assert by_test["t::test_rank"]["injected"] is True
    assert by_test["t::test_node"]["injected"] is False
    assert "before it injected" in by_test["t::test_node"]["error"]
    assert by_test["t::test_replica"]["survived"] is False  # a ledger, but the test failed

    payload = bench._payload({"commit": "abc"}, _Args(), [records, records], 10.0)
    assert payload["faults_injected"] == 6 and payload["faults_not_injected"] == 2
    assert payload["faults_survived"] == 2
    node = next(f for f in payload["summary"] if f["test"] == "t::test_node")
    assert (node["runs"], node["not_injected"], node["survived"]) == (2, 2, 0)
    assert node["outcome"] == "test failed before its fault"
    assert bench._survived_cell(node) == "– (2 not injected)"
    replica = next(f for f in payload["summary"] if f["test"] == "t::test_replica")
    assert replica["outcome"] == "did not complete"
    worker = next(f for f in payload["summary"] if f["test"] == "t::test_worker")
    assert bench._survived_cell(worker) == "2/2"


def test_records_from_before_the_flag_count_as_injected(bench):
    old = {"fault": "x", "test": "t::x", "survived": False, "no_ledger": True, "error": "e"}
    payload = bench._payload({}, _Args(), [[old]], 1.0)
    assert payload["faults_injected"] == 1 and payload["faults_not_injected"] == 0
    assert payload["summary"][0]["outcome"] == "test failed"


def test_pytest_s_own_report_keeps_the_flag_of_a_failed_test_and_merges_its_teardown(
    bench, tmp_path
):
    """The report pytest writes: a test that recorded ``fault_injected`` and then failed
    keeps the property; one whose teardown also errored appears once; a skip is apart."""
    tests = tmp_path / "test_faults.py"
    tests.write_text(
        textwrap.dedent(
            """
            import json
            import pytest

            @pytest.fixture
            def breaks_on_teardown():
                yield
                raise RuntimeError("teardown")

            def test_before(record_property):
                assert False, "precondition"

            def test_after(record_property, breaks_on_teardown):
                record_property("fault_injected", "true")
                assert False, "fault not survived"

            def test_survived(record_property):
                record_property("fault_injected", "true")
                ledger = {"fault": "ok", "completed": True, "error": None, "resumed": False}
                record_property("fault", json.dumps(ledger))

            def test_skipped():
                pytest.skip("no ray CLI")
            """
        )
    )
    junit = tmp_path / "report.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)]
    subprocess.run([*command, f"--junitxml={junit}"], cwd=tmp_path, capture_output=True)
    assert junit.read_text().count('name="test_after"') == 2  # the call, then the teardown
    cases = bench._cases(junit)
    assert len(cases) == 4
    by_test = {f["test"].split("::")[-1]: f for f in bench._fault_records(cases)}
    assert set(by_test) == {"test_before", "test_after", "test_survived", "test_skipped"}
    assert (by_test["test_before"]["injected"], by_test["test_after"]["injected"]) == (
        False,
        True,
    )
    assert by_test["test_survived"]["survived"] is True
    assert by_test["test_skipped"]["skipped"] is True
    payload = bench._payload({}, _Args(), [list(by_test.values())], 1.0)
    assert (payload["faults_injected"], payload["faults_not_injected"]) == (2, 2)
    outcomes = {f["test"].split("::")[-1]: f["outcome"] for f in payload["summary"]}
    assert outcomes["test_skipped"] == "skipped"
    assert outcomes["test_before"] == "test failed before its fault"
    assert outcomes["test_after"] == "test failed"


def test_a_row_is_described_by_a_run_that_had_its_fault(bench):
    before = {"fault": "t", "test": "t::t", "survived": False, "no_ledger": True}
    before |= {"injected": False, "error": "e", "completed": False}
    after = before | {"injected": True}
    (row,) = bench._payload({}, _Args(), [[before], [after]], 1.0)["summary"]
    assert row["outcome"] == "test failed" and row["not_injected"] == 1
    assert bench._survived_cell(row) == "0/1 (1 not injected)"
    (none,) = bench._payload({}, _Args(), [[before]], 1.0)["summary"]
    assert bench._survived_cell(none) == "– (1 not injected)"


class _Args:
    keyword = None
