"""`dcgmi diag -r <level> -j`: the JSON document DCGM's diagnostic prints.

Two shapes exist. DCGM 4.x writes ``{"DCGM Diagnostic": {"test_categories": [{"category",
"tests": [{"name", "results": [{"entity_group", "entity_id", "status", "warnings": [{
"warning", "error_id", ...}]}], "test_summary": {"status", "warnings"}}]}]}, "entity_groups",
"metadata": {"version"}}``; releases before it used the root key "DCGM GPU Diagnostic" and
``gpu_ids`` instead of entities. A run that could not start prints only
``{"DCGM Diagnostic": {"runtime_error": ...}}``. Statuses are "Pass", "Fail", "Warn" (older
releases; 4.x folds a warning into "Fail") and "Skip".

We trust the document, not dcgmi's exit status (a failing diagnostic exits with a negative
DCGM return code, which says no more than the document does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hyperpod_agent.deepcheck.model import CheckOutcome, Judgement, one_line
from hyperpod_agent.deepcheck.parsing import ParseError, and_more

ROOT_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")

# worst first: the status of a test is the worst of its results
_RANK = {"fail": 0, "warn": 1, "pass": 2, "skip": 3}


@dataclass(frozen=True)
class DiagEntry:
    """One result of one test: for one entity, or the test's summary (entity "")."""

    test: str
    category: str
    entity: str
    status: str
    messages: tuple[str, ...] = ()
    summary: bool = False

    @property
    def rank(self) -> int:
        return _RANK.get(self.status.lower(), 4)

    def describe(self, verb: str = "") -> str:
        """ "memory failed on GPU 3: <first message>"."""
        said = f" {verb}" if verb else ""
        where = f" on {self.entity}" if self.entity else ""
        what = f": {self.messages[0]}" if self.messages else ""
        return f"{self.test}{said}{where}{what}"


@dataclass(frozen=True)
class DiagReport:
    entries: tuple[DiagEntry, ...]
    tests: tuple[str, ...]
    gpus: int
    version: str
    runtime_error: str | None = None


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ParseError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ParseError(f"{what}: expected a list, got {type(value).__name__}")
    return value


def _messages(result: dict[str, Any]) -> tuple[str, ...]:
    raw = result.get("warnings", [])
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for item in items:
        text = item.get("warning") if isinstance(item, dict) else item
        if isinstance(text, str) and text.strip():
            out.append(one_line(text, 200))
    return tuple(out)


def _entity(result: dict[str, Any]) -> str:
    group, ident = result.get("entity_group"), result.get("entity_id")
    if isinstance(group, str) and isinstance(ident, int) and group not in ("", "None"):
        return f"{group} {ident}"
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if isinstance(ids, int):
        return f"GPU {ids}"
    if isinstance(ids, str) and ids.strip():
        return ("GPUs " if "," in ids else "GPU ") + ids.strip()
    return ""


def _status(result: dict[str, Any], what: str) -> str:
    status = result.get("status")
    if not isinstance(status, str) or not status:
        raise ParseError(f"{what}: no status")
    return status


def _entries(root: dict[str, Any]) -> tuple[list[DiagEntry], list[str]]:
    entries: list[DiagEntry] = []
    tests: list[str] = []
    for ci, category in enumerate(_list(root.get("test_categories"), "test_categories")):
        category = _obj(category, f"test_categories[{ci}]")
        cname = str(category.get("category", ""))
        for ti, test in enumerate(_list(category.get("tests", []), f"{cname}.tests")):
            test = _obj(test, f"{cname}.tests[{ti}]")
            name = test.get("name")
            if not isinstance(name, str) or not name:
                raise ParseError(f"{cname}.tests[{ti}]: no name")
            tests.append(name)
            for ri, result in enumerate(_list(test.get("results", []), f"{name}.results")):
                result = _obj(result, f"{name}.results[{ri}]")
                status = _status(result, f"{name}.results[{ri}]")
                entries.append(DiagEntry(name, cname, _entity(result), status, _messages(result)))
            summary = test.get("test_summary")
            if summary is not None:
                summary = _obj(summary, f"{name}.test_summary")
                status = _status(summary, f"{name}.test_summary")
                entries.append(DiagEntry(name, cname, "", status, _messages(summary), True))
    return entries, tests


def _gpu_count(doc: dict[str, Any], entries: list[DiagEntry]) -> int:
    groups = doc.get("entity_groups")
    for group in groups if isinstance(groups, list) else []:
        if isinstance(group, dict) and group.get("entity_group") == "GPU":
            entities = group.get("entities")
            if isinstance(entities, list):
                return len(entities)
    return len({e.entity for e in entries if e.entity.startswith("GPU ")})


def parse_diag_json(text: str) -> DiagReport:
    """The document's results, in order; ParseError for anything that is not one."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"not JSON ({exc.msg} at line {exc.lineno})") from None
    doc = _obj(doc, "document")
    key = next((k for k in ROOT_KEYS if k in doc), None)
    if key is None:
        raise ParseError("no 'DCGM Diagnostic' object")
    root = _obj(doc[key], key)
    meta = doc.get("metadata")
    version = meta.get("version") if isinstance(meta, dict) else root.get("version")
    error = root.get("runtime_error")
    if isinstance(error, str) and error.strip():
        return DiagReport((), (), 0, str(version or ""), one_line(error, 240))
    entries, tests = _entries(root)
    return DiagReport(tuple(entries), tuple(tests), _gpu_count(doc, entries), str(version or ""))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def judge_diag(report: DiagReport) -> Judgement:
    """FAIL naming the first failing test, entity and message; UNKNOWN when the
    diagnostic could not run or ran nothing; OK otherwise (warnings noted)."""
    if report.runtime_error is not None:
        return Judgement(
            CheckOutcome.UNKNOWN, one_line(f"dcgmi diag could not run: {report.runtime_error}")
        )
    status = {
        t: min((e.rank for e in report.entries if e.test == t), default=4) for t in report.tests
    }
    counts = {rank: sum(1 for r in status.values() if r == rank) for rank in range(5)}
    failed, warned, passed, skipped = counts[0], counts[1], counts[2], counts[3]
    figures: dict[str, float] = {
        "tests_passed": passed,
        "tests_failed": failed,
        "tests_warned": warned,
        "tests_skipped": skipped,
        "gpus": report.gpus,
    }
    if failed:
        failing = [e for e in report.entries if e.rank == 0 and not e.summary]
        failing_tests = {e.test for e in failing}
        failing += [e for e in report.entries if e.rank == 0 and e.test not in failing_tests]
        cause = and_more([e.describe("failed") for e in failing])
        return Judgement(CheckOutcome.FAIL, one_line(cause), figures)
    if passed + warned == 0:
        return Judgement(
            CheckOutcome.UNKNOWN, f"no diagnostic test ran ({skipped} skipped)", figures
        )
    cause = f"{_plural(passed + warned, 'test')} passed on {_plural(report.gpus, 'GPU')}"
    if skipped:
        cause += f", {skipped} skipped"
    if warned:
        first = next(e for e in report.entries if e.rank == 1)
        cause += f"; warned: {first.describe()}"
    return Judgement(CheckOutcome.OK, one_line(cause), figures)
