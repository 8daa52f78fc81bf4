"""Production refuses to start with guessable secrets: `check --deploy` fails, and so does
`serve`, naming each variable to fix. Outside production nothing is asked of them."""

import pytest

from platform_site.checks import MIN_SECRET_LENGTH, secret_problem
from tests.deploy.env_example import env_example
from tests.platform.commands import GOOD, manage
from tests.processes import free_port

SECRETS = ("SECRET_KEY", "LORAPLEX_OPERATOR_TOKEN", "LORAPLEX_METRICS_TOKEN")


def production(tmp_path, **values) -> dict:
    env = {"LORAPLEX_ENV": "production", "LORAPLEX_VAR_DIR": str(tmp_path)}
    return env | {"ALLOWED_HOSTS": "loraplex.example.com"} | GOOD | values


def test_the_example_placeholders_and_short_values_are_refused():
    example = env_example()
    for name in SECRETS:
        assert secret_problem(example[name]), f"{name}'s example value would pass"
    assert secret_problem("") == "is not set"
    assert "31 characters" in secret_problem("a" * (MIN_SECRET_LENGTH - 1))
    assert "placeholder" in secret_problem("CHANGE-ME-" + "a" * 40)
    assert secret_problem("a" * MIN_SECRET_LENGTH) is None


def test_check_deploy_passes_with_good_secrets(tmp_path):
    result = manage("check", "--deploy", env=production(tmp_path))
    assert result.returncode == 0, result.stderr


def test_check_deploy_names_every_weak_secret(tmp_path):
    example = env_example()
    env = production(
        tmp_path,
        SECRET_KEY=example["SECRET_KEY"],  # 33 characters: long enough, but public
        LORAPLEX_OPERATOR_TOKEN="short-operator-token",
        LORAPLEX_METRICS_TOKEN="",
        LORAPLEX_API_KEY_SECRET=example["LORAPLEX_OPERATOR_TOKEN"],
    )
    result = manage("check", "--deploy", env=env)
    assert result.returncode != 0
    assert "SECRET_KEY is still the placeholder from .env.example" in result.stderr
    assert "LORAPLEX_API_KEY_SECRET is still the placeholder" in result.stderr
    assert "LORAPLEX_OPERATOR_TOKEN is 20 characters long" in result.stderr
    assert "LORAPLEX_METRICS_TOKEN is not set" in result.stderr


def test_check_deploy_refuses_debug_and_a_shared_metrics_token(tmp_path):
    env = production(tmp_path, DEBUG="1", LORAPLEX_METRICS_TOKEN=GOOD["LORAPLEX_OPERATOR_TOKEN"])
    result = manage("check", "--deploy", env=env)
    assert result.returncode != 0
    assert "DEBUG is on in production" in result.stderr
    assert "LORAPLEX_METRICS_TOKEN repeats another secret" in result.stderr


def test_development_asks_nothing_of_the_tokens(tmp_path):
    result = manage("check", "--deploy", env={"LORAPLEX_VAR_DIR": str(tmp_path)})
    assert "loraplex.E" not in result.stdout + result.stderr


@pytest.mark.parametrize("name", ["LORAPLEX_METRICS_TOKEN", "LORAPLEX_OPERATOR_TOKEN"])
def test_serve_in_production_refuses_to_start_with_a_weak_secret(tmp_path, name):
    env = production(tmp_path, LORAPLEX_ENGINE="off") | {name: "change-me"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    result = manage("serve", "--port", str(free_port()), env=env)
    assert result.returncode != 0
    assert f"{name} is still the placeholder from .env.example" in result.stderr
