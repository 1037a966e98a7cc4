"""Writes pytest's assertion-rewritten bytecode once, before the suite starts its processes
(`make bytecode`): `python -m tests.rewrite_cache`.

pytest rewrites the asserts of every module it imports as a test file, a conftest or a plugin (all
of a plugin's distribution: hypothesis, schemathesis, pytest-django, ...), and caches the result
beside the source only where bytecode may be written. Where PYTHONDONTWRITEBYTECODE is set, as on
the machines this suite runs on, each pytest process rewrote all of them again: about 8 s of CPU
for each of the run's four (the controller and three workers), when the machine is busiest (the
shared demo's start-up). pytest still reads a cache that is there, and checks it against the
source's hash, so a file edited later is rewritten as before.

The rewriting is pytest's own (`_rewrite_test`, its pyc format and name); which files get it
follows pytest's rules: the test files and conftests under the test paths, the `-p` plugins of
addopts, and the packages of every installed pytest11 plugin. A file listed here that pytest never
imports costs a stale cache file, nothing else; one missed is rewritten by pytest as before. This
is only a cache: when pytest's internals differ from what this expects, it says so and writes none.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import os
import shlex
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _pytest_ini() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        ini: dict[str, Any] = tomllib.load(fh)["tool"]["pytest"]["ini_options"]
    return ini


def _test_files(ini: dict[str, Any]) -> Iterator[Path]:
    """Test modules (pytest's default python_files) and conftests under the test paths."""
    for top in ini.get("testpaths", ["."]):
        for path in sorted((ROOT / str(top)).rglob("*.py")):
            name = path.name
            if name == "conftest.py" or (name.startswith("test_") or name.endswith("_test.py")):
                yield path


def _addopts_plugins(ini: dict[str, Any]) -> Iterator[Path]:
    """The modules addopts loads with `-p` (pytest rewrites them as plugins)."""
    args = shlex.split(str(ini.get("addopts", "")))
    for flag, value in itertools.pairwise(args):
        if flag == "-p" and not value.startswith("no:"):
            spec = importlib.util.find_spec(value)
            if spec and spec.origin and spec.origin.endswith(".py"):
                yield Path(spec.origin)


def _plugin_distribution_files() -> Iterator[Path]:
    """Every Python file of the packages pytest marks for rewriting in each installed plugin's
    distribution (pytest's _mark_plugins_for_rewrite)."""
    from _pytest.config import _iter_rewritable_modules

    for dist in importlib.metadata.distributions():
        if not any(ep.group == "pytest11" for ep in dist.entry_points):
            continue
        files = [str(f) for f in dist.files or []]
        names = set(_iter_rewritable_modules(files))
        for f in files:
            if f.endswith(".py") and (f[:-3] in names or f.split("/", 1)[0] in names):
                yield Path(str(dist.locate_file(f)))


def _write(path: Path) -> bool:
    """pytest's rewritten code of `path`, in the file and format its import hook reads."""
    from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc, _rewrite_test, _write_pyc_fp, get_cache_dir

    pyc = get_cache_dir(path) / (path.name[:-3] + PYC_TAIL)
    if _read_pyc(path, pyc) is not None:
        return False  # already there for this source
    source_hash, code = _rewrite_test(path, None)  # type: ignore[arg-type]  # None: as with the hook off (main)
    pyc.parent.mkdir(exist_ok=True)
    partial = pyc.with_name(f"{pyc.name}.{os.getpid()}")
    with partial.open("wb") as fh:
        _write_pyc_fp(fh, source_hash, code)
    partial.replace(pyc)  # atomic, as pytest writes it: a reader sees the old file or the whole new one
    return True


def main() -> int:
    try:
        from _pytest.assertion import rewrite

        for name in ("PYC_TAIL", "_read_pyc", "_rewrite_test", "_write_pyc_fp", "get_cache_dir"):
            getattr(rewrite, name)
    except (ImportError, AttributeError) as exc:
        print(f"tests.rewrite_cache: pytest's rewrite internals have changed ({exc}); no cache written")  # noqa: T201 - a build step's note
        return 0
    ini = _pytest_ini()
    if ini.get("enable_assertion_pass_hook"):
        print("tests.rewrite_cache: enable_assertion_pass_hook changes the rewrite; no cache written")  # noqa: T201 - a build step's note
        return 0
    paths = sorted({*_test_files(ini), *_addopts_plugins(ini), *_plugin_distribution_files()})
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        written = sum(pool.map(_write, paths, chunksize=16))
    print(f"tests.rewrite_cache: {written} of {len(paths)} modules rewritten")  # noqa: T201 - a build step's note
    return 0


if __name__ == "__main__":
    sys.exit(main())
