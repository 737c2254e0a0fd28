"""Everything the repo cites lies inside the repo: a user's clone has no sibling folders and no build machine's paths.

Scans every tracked text file (not JSON measurements, which may record the machine they ran on) for references
to folders beside the checkout, to notes that were never committed and to absolute build-machine paths, and
checks that every `some/file.md#anchor` citation names a heading that exists.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

# Data and binary files: not citations, and measurement JSON may hold the paths of the machine that measured.
SKIPPED_SUFFIXES = {".json", ".jsonl", ".png", ".jpg", ".svg", ".safetensors", ".gguf", ".pt", ".bin", ".gz",
                    ".zip", ".tar"}

SIBLING = "sha" + "red"  # spelled apart so that this file does not match its own patterns
OUTSIDE = [
    (re.compile(r"\.\./" + SIBLING + r"\b"), "a folder beside the checkout"),
    (re.compile(r"\b" + SIBLING + r"/(data|DESIGN|research)\b"), "the build machine's shared folder"),
    (re.compile(r"\bresearch/[\w.-]+\.md\b"), "a research note that is not in the repo"),
    (re.compile(r"(?<![\w/.-])(algorithm|alfworld|webshop|compute|aesthetics|ecosystem|anchor-agentgym)\.md\b"),
     "a research note that is not in the repo"),
    (re.compile(r"(?<![\w.-])/" + "work" + r"/"), "an absolute path of the build machine"),
]

# The one allowed line: the Makefile's default data-root (where this machine keeps data; a search location that
# `make DATA_ROOT=...` overrides), not a citation.
EXEMPT = {"Makefile": re.compile(r"^DATA_ROOT \?= \$\(abspath \.\./" + SIBLING + r"/data\)\s*$")}

CITATION = re.compile(r"(?P<path>[\w./-]*[\w-]\.md)#(?P<anchor>[\w-]+)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def tracked_text_files() -> list[Path]:
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"not a git checkout ({error}): the scan covers tracked files")
    files = []
    for name in listing.decode().split("\0"):
        path = ROOT / name
        if not name or name == THIS or path.suffix.lower() in SKIPPED_SUFFIXES or not path.is_file():
            continue
        files.append(path)
    return files


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def numbered_lines(files: list[Path]):
    """(path, its name from the repo root, line number, line) of every line of the readable text files."""
    for path in files:
        text = read_text(path)
        if text is not None:
            name = path.relative_to(ROOT).as_posix()
            for number, line in enumerate(text.splitlines(), 1):
                yield path, name, number, line


def outside_references(files: list[Path]) -> tuple[list[str], dict[str, list[str]]]:
    """(offending 'file:line: reason: text' entries, exempted lines per file)."""
    offending, exempted = [], {}
    for path, name, number, line in numbered_lines(files):
        reasons = [reason for pattern, reason in OUTSIDE if pattern.search(line)]
        if not reasons:
            continue
        if name in EXEMPT and EXEMPT[name].match(line):
            exempted.setdefault(name, []).append(line)
            continue
        offending.append(f"{name}:{number}: {reasons[0]}: {line.strip()}")
    return offending, exempted


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_of(markdown: str) -> set[str]:
    """Every anchor a Markdown file defines: its headings' slugs (repeats numbered as GitHub does) and <a id>."""
    anchors: set[str] = set(HTML_ANCHOR.findall(markdown))
    seen: dict[str, int] = {}
    in_fence = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else HEADING.match(line)
        if match:
            slug = github_slug(match.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_anchor_citations(files: list[Path]) -> list[str]:
    broken = []
    for path, name, number, line in numbered_lines(files):
        for match in CITATION.finditer(line):
            if match.group("path").startswith("//") or re.search(r"[a-z]+:(//)?\S*$", line[:match.start()]):
                continue  # part of a URL: another site's anchor
            cited = match.group("path")
            # A Markdown link is relative to its file; a citation in code names a path from the repo root.
            candidates = [path.parent / cited, ROOT / cited] if path.suffix == ".md" else [ROOT / cited,
                                                                                          path.parent / cited]
            target = next((c.resolve() for c in candidates if c.is_file()), None)
            if target is None or ROOT not in target.parents:
                broken.append(f"{name}:{number}: cites {cited}, which is not a file in the repo")
            elif match.group("anchor") not in anchors_of(target.read_text(encoding="utf-8")):
                broken.append(f"{name}:{number}: {cited} has no heading with anchor #{match.group('anchor')}")
    return broken


def test_nothing_cites_a_place_outside_the_repo():
    offending, _ = outside_references(tracked_text_files())
    assert not offending, "cite docs/DESIGN.md or docs/DATA.md instead:\n" + "\n".join(offending)


def test_the_makefile_data_root_is_the_one_exemption():
    _, exempted = outside_references(tracked_text_files())
    assert len(exempted.get("Makefile", [])) == 1, exempted
    assert set(exempted) == {"Makefile"}, exempted


def test_every_anchor_citation_resolves_to_a_heading():
    broken = broken_anchor_citations(tracked_text_files())
    assert not broken, "\n".join(broken)


def test_the_design_document_is_in_the_repo():
    design = ROOT / "docs" / "DESIGN.md"
    assert design.is_file()
    anchors = anchors_of(design.read_text(encoding="utf-8"))
    for section in ("layout-and-process-model", "the-wire-and-its-promises", "the-method", "the-estimator-contract",
                    "the-baselines-as-run", "anchor-protocol", "config-model"):
        assert section in anchors, f"docs/DESIGN.md has no section #{section}"
    assert (ROOT / "docs" / "DATA.md").is_file()


@pytest.mark.parametrize(("line", "flagged"), [
    ("see ../" + SIBLING + "/data/webshop/SOURCE.md", True),
    ("Hashes: " + SIBLING + "/data/webshop/SOURCE.md.", True),
    ("(research/" + "algorithm.md §2.1)", True),
    ("verl (algorithm" + ".md §3.3)", True),
    ("ALFWORLD_DATA=/" + "work/x", True),
    ("(docs/DESIGN.md#anchor-protocol)", False),
    ("docs/RESULTS_interpretation.md", False),
])
def test_the_patterns_catch_what_they_should(line, flagged):
    assert any(pattern.search(line) for pattern, _ in OUTSIDE) == flagged


def test_github_slugs():
    assert github_slug("The wire and its promises") == "the-wire-and-its-promises"
    assert github_slug("ALFWorld libdownward per PddlEnv") == "alfworld-libdownward-per-pddlenv"
    assert github_slug("`Episode` stream: step_index de-dup") == "episode-stream-step_index-de-dup"
    assert anchors_of("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_a_citation_of_a_missing_heading_or_file_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "DESIGN.md").write_text("# Design\n\n## The wire and its promises\n")
    citing = tmp_path / "code.py"
    citing.write_text("# docs/DESIGN.md#the-wire-and-its-promises\n# docs/DESIGN.md#the-wire\n"
                      "# docs/GONE.md#x, https://example.org/README.md#y\n")
    assert broken_anchor_citations([citing]) == [
        "code.py:2: docs/DESIGN.md has no heading with anchor #the-wire",
        "code.py:3: cites docs/GONE.md, which is not a file in the repo",
    ]
