"""The repository stands alone: a reader can open everything it cites.

Code, tests and docs cite the repository's own files (docs/design.md for the binding contracts),
never a design or style file kept outside it, and name a capability by what it does, never by a
tracker number nobody outside the team can look up. Every doc in docs/ is reachable from the index,
docs/README.md.

The forbidden pattern is built from pieces, so that this file does not match it itself.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED_SUFFIXES = (".py", ".md", ".html", ".yaml", ".toml")

_UPPER_D = "DES" + "IGN"
_ISSUE = "[Ii]ss" + "ues?"
FORBIDDEN = re.compile("|".join((
    _UPPER_D + r"\.md",
    _UPPER_D + " §",
    "STY" + r"LE\.md",
    "STY" + "LE §",
    "MIS" + r"SION\.md",
    "FGD_" + "EXPERIMENT",
    r"\.\./" + "shared",
    _ISSUE + " #?[0-9]+",
)))

# Markdown links to a doc beside the index: [text](name.md) or [text](./name.md).
_LINK = re.compile(r"\]\((?:\./)?([^)#\s]+)(?:#[^)]*)?\)")


def _tracked_files() -> list[Path]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: which files are tracked is unknown")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return [ROOT / name for name in listed.decode().split("\0") if name.endswith(SCANNED_SUFFIXES)]


@pytest.mark.parametrize("text", [
    _UPPER_D + " §5",
    "see " + _UPPER_D + ".md",
    "STY" + "LE.md, rule 3",
    "STY" + "LE §7",
    "the study (MIS" + "SION.md)",
    "FGD_" + "EXPERIMENT.md §2",
    "../" + "shared/notes",
    "iss" + "ue 17",
    "Iss" + "ue 12, item 8",
    "iss" + "ues 16-17",
    "iss" + "ue #3",
])
def test_the_check_catches_each_kind_of_outside_reference(text: str) -> None:
    assert FORBIDDEN.search(text)


@pytest.mark.parametrize("text", [
    "docs/design.md, Weighted fair sharing",
    "the issue date of an invoice",
    "VGPU_ADMISSION_TOKEN_FILE",
    "a shared pool of GPUs",
    "the design of the ledger",
])
def test_the_check_leaves_ordinary_words_alone(text: str) -> None:
    assert not FORBIDDEN.search(text)


def test_no_tracked_file_cites_what_lies_outside_the_repository() -> None:
    offending = []
    for path in _tracked_files():
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                offending.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offending, "cite the repository's own docs and name the capability instead:\n" + "\n".join(offending)


def test_every_doc_is_linked_from_the_docs_index() -> None:
    docs = ROOT / "docs"
    linked = set(_LINK.findall((docs / "README.md").read_text(encoding="utf-8")))
    unlinked = sorted(p.name for p in docs.glob("*.md") if p.name != "README.md" and p.name not in linked)
    assert not unlinked, f"add a line for each to docs/README.md: {unlinked}"
