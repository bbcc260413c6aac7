"""Every error code the API can answer with is in ERROR_CODES, with one status, and
docs/controller.md lists exactly those codes with those statuses."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hyperpod_agent.controller.api import app as api
from hyperpod_agent.controller.api.guard import AUTH_CODES
from hyperpod_agent.controller.api.models import ERROR_CODES

ROOT = Path(__file__).resolve().parents[3]
CONTROLLER = ROOT / "hyperpod_agent" / "controller"
# Calls whose (status, code) literals become an answer: Rejected(409, "stale", ...),
# refuse(400, "bad_request", ...), error_response(500, "internal", ...).
ANSWERING = {"Rejected", "refuse", "error_response"}


def documented() -> dict[str, int]:
    text = (ROOT / "docs" / "controller.md").read_text()
    paragraph = text.split("\nErrors: ", 1)[1].split("\n\n", 1)[0]
    codes: dict[str, int] = {}
    # Codes are the backticked words outside the parenthesised explanations.
    for part in re.sub(r"\([^)]*\)", "", paragraph).split(";"):
        status = re.match(r"\s*(\d{3})\s", part)
        assert status, f"an Errors entry without a status: {part!r}"
        for code in re.findall(r"`([a-z_]+)`", part):
            assert code not in codes, f"{code} documented twice"
            codes[code] = int(status.group(1))
    return codes


def emitted() -> set[tuple[int, str]]:
    found = set()
    for path in CONTROLLER.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            literals = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if name in ANSWERING and len(literals) >= 2:
                status, code = literals[0], literals[1]
                if isinstance(status, int) and isinstance(code, str):
                    found.add((status, code))
    return found


def test_docs_list_exactly_the_error_codes() -> None:
    assert documented() == ERROR_CODES


def test_every_literal_answer_is_a_listed_code_with_its_status() -> None:
    answers = emitted()
    assert ("409", "stale") not in answers and (409, "stale") in answers  # the scan works
    for status, code in answers:
        assert ERROR_CODES.get(code) == status, (status, code)


def test_mapped_codes_are_listed_with_their_status() -> None:
    for status, code in [*AUTH_CODES.items(), *api.HTTP_CODES.items()]:
        assert code in ERROR_CODES, code
        # The FastAPI handler answers with the listed status, whatever FastAPI said.
        assert ERROR_CODES[code] == status or code == "malformed_json", (status, code)
