"""The product's text is about the product: no account of how it was developed.

README.md, docs/*.md, ci/README.md, results/README.md and the code and scripts of reference/, harness/,
suites/ and ci/ must not speak of working sessions, lent or borrowed machines, device calls and their limits,
issue numbers or design cards. Markdown pages must not cite commit hashes either, except in a results table (a
row of README.md's or results/README.md's tables may name the commit a result was measured at). A failure
names file:line and the words.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROCESS_WORDS = [
    r"\bthis session\b",
    r"\bsession's\b",
    r"\b(first|second|third|fourth|fifth|earlier|previous|next|later|last|another) session\b",
    r"\blent\b",
    r"\bborrowed\b",
    r"\bissues? \d+(\.\d+)?\b",
    r"\bdesign card",
    r"\bdevice (call|command)s?\b",
    r"\bdevice budget\b",
    r"\bremote (call|machine|box)",
    r"\blease\b",
]
_PROCESS = re.compile("|".join(f"(?:{p})" for p in PROCESS_WORDS), re.IGNORECASE)
# A commit hash: 7 to 40 hex digits with at least one digit and one letter (so no plain number or word
# matches).
_HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
_RESULTS_TABLES = {"README.md", "results/README.md"}  # their table rows may name the commit of a result


def _pages() -> list[Path]:
    pages = [REPO / "README.md", REPO / "ci" / "README.md", REPO / "results" / "README.md"]
    return [p for p in pages if p.exists()] + sorted((REPO / "docs").glob("*.md"))


def _code() -> list[Path]:
    files = []
    for folder in ("reference", "harness", "suites", "ci"):
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".sh", ".yml") and p.is_file()]
    files += [p for p in [REPO / ".ci" / "run"] if p.exists()]
    this = Path(__file__).resolve()
    return sorted(p for p in files if p.resolve() != this and "__pycache__" not in p.parts)


def _hits(path: Path, hashes: bool) -> list[str]:
    name = path.relative_to(REPO).as_posix()
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        words = [m.group(0) for m in _PROCESS.finditer(line)]
        if hashes and not (name in _RESULTS_TABLES and line.lstrip().startswith("|")):
            words += [m.group(0) for m in _HASH.finditer(line)]
        if words:
            found.append(f"{name}:{number}: {', '.join(repr(w) for w in words)}: {line.strip()[:120]}")
    return found


def test_the_pages_speak_of_the_product_only():
    hits = [h for page in _pages() for h in _hits(page, hashes=True)]
    assert not hits, "words about how the project was developed, not about the product:\n" + "\n".join(hits)


def test_the_code_speaks_of_the_product_only():
    hits = [h for path in _code() for h in _hits(path, hashes=False)]
    assert not hits, "words about how the project was developed, not about the product:\n" + "\n".join(hits)


def test_the_patterns_catch_what_they_are_for():
    for text in [
        "in this session",
        "the lent H100",
        "issue 8",
        "issues 7.15",
        "Design card",
        "two device calls",
        "the session's budget",
        "a third session",
        "outlasts the lease",
    ]:
        assert _PROCESS.search(text), text
    for text in [
        "a lentil",
        "the session fixture",
        "an issue with the cache",
        "device time per call",
        "released",
    ]:
        assert not _PROCESS.search(text), text
    assert _HASH.search("at commit d6f3a65") and not _HASH.search("1440 MHz") and not _HASH.search("accede")
