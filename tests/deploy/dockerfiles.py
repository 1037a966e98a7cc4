"""Reading deploy/Dockerfile and deploy/Dockerfile.agent without Docker: their COPY sources
and RUN commands (continuation lines joined), for the structural tests and for the slim-agent
test that installs from exactly the files the agent image copies."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "deploy" / "Dockerfile"
AGENT = ROOT / "deploy" / "Dockerfile.agent"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, `\\` continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, f"{dockerfile.name} ends inside a continued line"
    return out


def copy_sources(dockerfile: Path) -> list[str]:
    """Every source path of every COPY (the build context is the repository root)."""
    sources: list[str] = []
    for keyword, args in instructions(dockerfile):
        if keyword == "COPY":
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            assert len(words) >= 2, f"COPY without a destination in {dockerfile.name}: {args}"
            sources.extend(words[:-1])
    return sources


def run_commands(dockerfile: Path) -> list[str]:
    return [args for keyword, args in instructions(dockerfile) if keyword == "RUN"]


def build_context(dockerfile: Path, dest: Path) -> Path:
    """Copies what `dockerfile` COPYs from the repository into `dest` (caches left out)."""
    for source in copy_sources(dockerfile):
        path = ROOT / source
        if path.is_dir():
            shutil.copytree(path, dest / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (dest / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / source)
    return dest
