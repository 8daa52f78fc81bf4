"""docker/ and .env.example, checked by reading them (Docker does not run on CI machines):
every setting is documented, the example values load, and the compose topology is whole."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.env_example import ENV_EXAMPLE, env_example

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
HAPROXY = ROOT / "docker" / "haproxy.cfg"


def documented() -> set[str]:
    """Every variable named in .env.example, set or shown commented with its default."""
    return set(re.findall(r"^#? ?([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.M))


def test_every_setting_and_every_readme_variable_is_in_the_env_example():
    settings_vars = set(
        re.findall(
            r'env\.\w+\(\s*"([A-Z][A-Z0-9_]*)"', (ROOT / "platform_site/settings.py").read_text()
        )
    )
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Configuration") :]
    table = table[: table.index("\n## ", 3)]
    readme_vars = {
        v
        for row in re.findall(r"^\| (`.*?) \|", table, re.M)
        for v in re.findall(r"`([A-Z][A-Z0-9_]*)`", row)
    }
    inference = {
        "LORAPLEX_ENGINE",
        "LORAPLEX_BASE_MODEL",
        "LORAPLEX_DEVICE",
        "LORAPLEX_DTYPE",
        "LORAPLEX_MAX_MODEL_LEN",
        "LORAPLEX_MAX_NUM_SEQS",
        "LORAPLEX_KV_CACHE_BYTES",
        "LORAPLEX_MAX_LORAS",
        "LORAPLEX_MAX_CPU_LORAS",
        "LORAPLEX_PINNED_ADAPTERS",
        "LORAPLEX_DRAIN_SECONDS",
    }
    assert len(settings_vars) > 40 and readme_vars
    missing = (settings_vars | readme_vars | inference) - documented()
    assert not missing, f"add to .env.example: {sorted(missing)}"


def test_the_example_values_load_in_production_mode(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        **env_example(),
        "LORAPLEX_VAR_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert env["LORAPLEX_ENV"] == "production"


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_runs_the_whole_topology_with_health_checks_and_volumes(compose):
    services = compose["services"]
    workers = ("worker", "worker-staging", "worker-evaluation")  # one per queue
    assert set(services) == {
        "postgres", "redis", "minio", "init", "web", *workers, "engine", "router"
    }  # fmt: skip
    for name in ("postgres", "redis", "minio", "web", *workers, "engine"):
        assert "healthcheck" in services[name], name
    for name in ("web", "engine"):
        assert "/readyz" in " ".join(services[name]["healthcheck"]["test"])
        assert services[name]["command"][:3] == ["python", "manage.py", "serve"]
    assert services["web"]["environment"]["LORAPLEX_ENGINE"] == "off"
    assert services["engine"]["environment"]["LORAPLEX_ENGINE"] == "on"
    # pins, the Engines page and scoring reach every replica
    for name in ("web", "worker", "worker-evaluation"):
        assert services[name]["environment"]["LORAPLEX_ENGINE_URLS"] == "dns+http://engine:8000"
    assert services["worker"]["command"][:5] == ["celery", "-A", "platform_site", "worker", "-B"]
    for name in ("web", *workers, "engine"):
        assert services[name]["depends_on"]["init"]["condition"] == "service_completed_successfully"
    assert set(compose["volumes"]) == {
        "postgres-data",
        "redis-data",
        "minio-data",
        "models",
        "adapter-cache",
    }
    assert "driver: nvidia" in COMPOSE.read_text()  # the GPU reservation, commented for CPU hosts


def test_compose_runs_engine_replicas_with_their_own_caches_behind_the_router(compose):
    """Each replica stages adapters to its own disk (the shared volume is the worker's), and
    only the router is published; it runs the shipped haproxy.cfg with the variables it reads."""
    services = compose["services"]
    engine, router = services["engine"], services["router"]
    assert engine["deploy"]["replicas"] == "${ENGINE_REPLICAS:-2}"
    assert {v.split(":")[0] for v in engine["volumes"]} == {"models"}  # what init imports
    own_cache = engine["environment"]["LORAPLEX_ADAPTER_CACHE_DIR"]
    assert own_cache != compose["x-env"]["LORAPLEX_ADAPTER_CACHE_DIR"]
    assert not any(v.split(":")[1] == own_cache for v in engine["volumes"])
    assert "adapter-cache" in {v.split(":")[0] for v in services["worker"]["volumes"]}
    assert "ports" not in engine
    assert router["ports"] == ["${ENGINE_PORT:-8001}:8000"]
    assert router["image"].startswith("haproxy:")
    assert router["volumes"] == ["./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"]
    text = HAPROXY.read_text()
    for variable in router["environment"]:
        assert "${" + variable + "}" in text, variable
    assert router["environment"]["HAPROXY_BIND"].endswith(":8000")
    assert "server-template engine " in text and " engine:8000 " in text
    # the grace period covers uvicorn's drain and the engine's shutdown (serve.py)
    drain = int(env_example()["LORAPLEX_DRAIN_SECONDS"])
    assert int(engine["stop_grace_period"].removesuffix("s")) >= 2 * drain + 5


def test_the_router_config_passes_haproxy_check(compose, tmp_path):
    """`haproxy -c` on the shipped file with compose's variables (Debian's haproxy, the
    version of compose's image: 2.6)."""
    binary = shutil.which("haproxy")
    if binary is None:
        if os.environ.get("LORAPLEX_REQUIRE_SERVICES") == "1":
            pytest.fail("haproxy is not installed (.ci/run installs Debian's package)")
        pytest.skip("haproxy is not installed (Debian: apt-get install haproxy)")
    env = {**os.environ, **compose["services"]["router"]["environment"]}
    env["HAPROXY_SOCKET"] = str(tmp_path / "haproxy.sock")
    done = subprocess.run(
        [binary, "-c", "-f", str(HAPROXY)], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Configuration file is valid" in done.stdout + done.stderr


def test_the_commands_in_docker_files_exist():
    from django.core.management import get_commands

    commands = get_commands()
    for name in ("serve", "migrate", "import_base_model", "collectstatic"):
        assert name in commands, name
    text = DOCKERFILE.read_text()
    assert "ARG BASE_IMAGE=" in text and "FROM ${BASE_IMAGE}" in text
    for copied in ("requirements.txt", "constraints.txt"):
        assert (ROOT / copied).is_file()
    init = ROOT / "docker" / "init.sh"
    assert subprocess.run(["bash", "-n", str(init)]).returncode == 0
    for command in ("migrate", "import_base_model"):
        assert f"manage.py {command}" in init.read_text()
