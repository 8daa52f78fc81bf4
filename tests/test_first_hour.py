"""`make run` as a new user meets it: scripts/run-embedded.sh on a fresh var dir, on the PORT
and HOST it is given. Its banner comes once the server is ready and the demo adapters have
been measured by the quality gate; every command it prints runs as printed and answers what
the README quotes; the printed operator token and demo folder make `load_lora_adapter` work,
and the printed operator account signs in to the admin.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.processes import ROOT, free_port
from tests.smollm2 import PRESET, smollm2_dir

pytestmark = pytest.mark.slow
README = (ROOT / "README.md").read_text()
READY = "Loraplex is ready on "
# Migrations, the worker and the engine starting, then the gate scoring three eval sets on a
# busy 2-core CPU: generous, since a machine that is only slow must not fail this.
START_SECONDS = 1200


def banner_block(banner: str, first: str, last: str) -> str:
    """The printed lines from the first matching `first` to the next matching `last`
    (regular expressions, on lines without their indent), as a user would copy them."""
    lines = banner.splitlines()
    start = next(i for i, line in enumerate(lines) if re.search(first, line.strip()))
    end = next(i for i in range(start, len(lines)) if re.search(last, lines[i].strip()))
    return "\n".join([lines[start].strip(), *lines[start + 1 : end + 1]])


def run_printed(command: str) -> str:
    """Paste a printed command into a shell: what it prints."""
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def readme_answers() -> dict[str, str]:
    """The answers the README quotes under its openai example: `# <model> -> <answer>`."""
    return dict(re.findall(r"^# (\S+) -> (.+)$", README, flags=re.MULTILINE))


class MakeRun:
    """scripts/run-embedded.sh on one var dir and port: started until its banner, stopped
    with Ctrl-C, started again on what it left (as a user restarts it)."""

    def __init__(self, tmp: Path):
        self.tmp, self.var, self.port = tmp, tmp / "var", free_port()
        (self.var / "models").mkdir(parents=True)
        (self.var / "models" / PRESET).symlink_to(smollm2_dir())  # converted once per checkout
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp),
            "LORAPLEX_VAR_DIR": str(self.var),
            "VENV": str(Path(sys.executable).parent.parent),
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
        }
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def start(self) -> str:
        """Run it until its banner is written whole: everything it printed."""
        self.runs += 1
        log = self.tmp / f"make-run-{self.runs}.log"
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                ["bash", "scripts/run-embedded.sh"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its worker and server with it, for stop()
            )
        deadline = time.monotonic() + START_SECONDS
        text = log.read_text()
        # its last command written: the banner is whole
        while READY not in text or '"lora_path"' not in text.split(READY)[1]:
            assert self.proc.poll() is None, f"run-embedded.sh exited:\n{text}"
            assert time.monotonic() < deadline, f"no banner:\n{text}"
            time.sleep(0.5)
            text = log.read_text()
        return text

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C, as a user stops it
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def manage(self, *args: str) -> str:
        """`.venv/bin/python manage.py ...` on its var dir, as the README has one type it."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    run = MakeRun(tmp_path_factory.mktemp("make-run"))
    yield run
    run.stop()


@pytest.fixture(scope="module")
def make_run(runner):
    """The first start on a fresh var dir: (its URL, what it printed)."""
    return runner.url, runner.start()


def printed(text: str, name: str) -> str:
    """The value of a variable the banner prints to export."""
    found = re.search(rf"^  export {name}=(\S+)$", text, flags=re.MULTILINE)
    assert found, f"the banner exports no {name}"
    return found[1]


def test_the_banner_comes_once_the_server_is_ready_and_the_gate_has_measured(make_run):
    url, text = make_run
    before, banner = text.split(READY)
    assert banner.startswith(f"{url}/")
    assert httpx.get(f"{url}/readyz", timeout=30).status_code == 200
    for name in ("demo-french", "demo-json", "demo-pirate"):
        said = re.search(rf"^{name}: v1 (.+)$", before, flags=re.MULTILINE)
        assert said, f"demo_adapters said nothing of {name}"
        line = said[1]
        match = re.fullmatch(
            rf"passed: perplexity ([\d.]+) vs ([\d.]+) for the base model alone, on 12 rows of "
            rf"its eval set, {name}@production",
            line,
        )
        assert match, line
        assert float(match[1]) < float(match[2])  # the adapter fits its style better
    # The same figures through the API, as the adapter's page shows them.
    key = printed(text, "KEY")
    version = httpx.get(
        f"{url}/api/v1/adapters/demo-pirate/versions/1/",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ).json()
    assert version["quality"] == "passed"
    evaluation = version["evaluation"]
    assert evaluation["eval_set"]["rows"] == 12 and evaluation["eval_set"]["kind"] == "own"
    assert evaluation["adapter"]["perplexity"] < evaluation["base"]["perplexity"]


def test_the_printed_examples_answer_what_the_readme_quotes(make_run):
    _, text = make_run
    answers = readme_answers()
    assert set(answers) == {"smollm2-135m-instruct", "demo-french", "demo-json", "demo-pirate"}
    python = banner_block(text, r"/bin/python - <<'PY'$", r"^PY$")
    assert "temperature=0" in python
    out = run_printed(python)
    got = dict(line.split(" -> ", 1) for line in out.splitlines())
    assert got == answers

    curl = banner_block(text, r"^curl \S+/v1/chat/completions", r"^-d '")
    assert '"temperature": 0' in curl
    reply = json.loads(run_printed(curl))
    assert reply["choices"][0]["message"]["content"] == answers["demo-pirate"]


def test_the_printed_token_and_demo_folder_make_load_lora_adapter_work(make_run):
    url, text = make_run
    load = banner_block(text, r"^curl \S+/v1/load_lora_adapter", r"^-d '")
    answer = json.loads(run_printed(load))
    assert answer == {
        "lora_name": "demo/demo-pirate",
        "action": "load_lora_adapter",
        "status": "ok",
        "version": "demo/demo-pirate:1",
        "created": False,
    }
    token = printed(text, "LORAPLEX_OPERATOR_TOKEN")
    listed = httpx.get(
        f"{url}/v1/lora_adapters", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert listed.status_code == 200, listed.text
    assert "demo/demo-pirate" in listed.text


def test_the_printed_operator_account_signs_in_to_the_admin(make_run):
    url, text = make_run
    email, password = re.search(r"Operator \(the admin at /admin/\): (\S+) / (\S+)", text).groups()
    admin = httpx.Client(base_url=url, timeout=60)
    admin.get("/admin/login/")
    response = admin.post(
        "/admin/login/?next=/admin/",
        data={
            "username": email,
            "password": password,
            "csrfmiddlewaretoken": admin.cookies["csrftoken"],
            "next": "/admin/",
        },
    )
    assert response.status_code == 302 and response.headers["location"] == "/admin/"
    assert "Site administration" in admin.get("/admin/").text


def test_the_readme_documents_port_and_host_as_the_script_reads_them():
    script = (ROOT / "scripts" / "run-embedded.sh").read_text()
    for name, default in (("PORT", "8000"), ("HOST", "127.0.0.1")):
        assert f"{name}=${{{name}:-{default}}}" in script
        assert re.search(rf"^\| `{name}` \| `{re.escape(default)}` \| .+\|$", README, re.MULTILINE)
    assert "PORT=8080 make run" in README


def test_a_second_revision_of_the_demo_base_re_runs_the_gate(make_run, runner):
    """The README's upgrade story: stop, import a nudged revision, start again; the gate
    re-measures each demo adapter there against its first figure."""
    url, text = make_run
    key = printed(text, "KEY")
    runner.stop()
    said = runner.manage("demo_base_revision", "--scale", "0.05")
    assert "every adapter version on it is pending" in said
    again = runner.start()
    before = again.split(READY)[0]
    assert "already imported, kept" in before  # make run kept the new revision

    def version(name):
        return httpx.get(
            f"{url}/api/v1/adapters/{name}/versions/1/",
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        ).json()

    french = version("demo-french")
    assert french["quality"] == "degraded"
    assert french["evaluation"]["trigger"] == "base_upgrade"
    assert french["evaluation"]["ratio"] > 1.10
    assert "demo-french: v1 not promoted: v1 has not passed its evaluation: degraded" in before
    for name in ("demo-json", "demo-pirate"):
        passed = version(name)
        assert passed["quality"] == "passed", passed["quality_detail"]
        assert passed["evaluation"]["trigger"] == "base_upgrade"
        assert passed["evaluation"]["ratio"] <= 1.10
    refused = httpx.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "demo-french", "messages": [{"role": "user", "content": "Hi"}]},
        timeout=60,
    )
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_not_servable"
