"""Tokenizing isolation: /healthz and another tenant's chat while one tenant tokenizes
megabytes, against a live `manage.py serve` with SmolLM2 (or --model).

    .venv/bin/python bench/tokenize_isolation.py [--model DIR] [--seconds 15] [--attackers 4]
        [--pace 1.0] [--server-root DIR] [--server-env KEY=VALUE,...]

Everything runs in a throwaway var dir (SQLite, local object store). Tenant A attacks, tenant
B is the bystander. Phases, each --seconds long: `idle` (nothing else runs), then with
--attackers loops of tenant A at once (6 for the chat phase, as first reported):
`tokenize_1mb` (/tokenize of a 1 MB text, `return_token_strs`), `chat_660k` (a chat prompt of
660,000 characters: just under the old bound of 8192 tokens x 81 characters), and the
heaviest texts the limits still tokenize: `tokenize_at_limit` and `chat_at_limit` (prompts of
max_model_len x 8 characters, LORAPLEX_MAX_CHARS_PER_TOKEN's default; the chat's 1,024
fewer, room for its template). Meanwhile this process
probes GET /healthz every 25 ms and sends tenant B's chat (16 tokens, greedy, `ignore_eos`)
one after another. Each attacker starts a request at most once a --pace seconds (1: the load
first reported, four at a time of about a second each, whatever the server now answers and
how fast; 0: a flood, which the requests-per-minute limit meets). The attackers run in a
child process so that reading their answers never delays a probe's clock. The server keeps
its default limits.

First, in this process, whether `tokenizers` holds the GIL while it encodes the megabyte
(`gil`: the longest wait of a thread that wakes every millisecond, through `encode` and
through `encode_batch`, the path the engine takes). Goals: /healthz under 100 ms (the
largest probe) and B's chat within 1.5x its idle median, in every attack phase.
--server-root starts `serve` from another checkout (a copy of an older commit, say) with this
venv, for a before/after on the same machine. The last line printed is one JSON object of
the figures.
"""

import asyncio
import json
import logging
import multiprocessing
import os
import queue
import random
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import bench_parser, model_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASE = "smollm2-135m-instruct"
HEALTHZ_EVERY = 0.025
HEALTHZ_GOAL_MS = 100
CHAT_GOAL_RATIO = 1.5
CHARS_PER_TOKEN = 8  # LORAPLEX_MAX_CHARS_PER_TOKEN's default
QUESTION = [{"role": "user", "content": "Name three colours."}]


# Printable ASCII but the two characters JSON escapes, so a text's body is its length.
ALPHABET = (
    string.ascii_letters
    + string.digits
    + string.punctuation.replace('"', "").replace("\\", "")
    + " "
)


def random_text(chars: int, seed: int = 0) -> str:
    """Printable ASCII drawn at random: about one token per character, the costliest text to
    tokenize per byte (1 MB: about 900k tokens)."""
    return "".join(random.Random(seed).choices(ALPHABET, k=chars))


def gil_held(folder: Path, text: str) -> dict:
    """Whether `tokenizers` keeps the GIL while it encodes: the longest a thread that wakes
    every millisecond waits while another thread encodes `text`, through the single-text
    `encode` and through `encode_batch` (the path the engine's Tokenizer takes)."""
    import threading

    from tokenizers import Tokenizer as Backend

    backend = Backend.from_file(str(folder / "tokenizer.json"))

    def worst_gap(work) -> dict:
        gaps: list[float] = []
        stop = threading.Event()

        def tick():
            last = time.perf_counter()
            while not stop.is_set():
                time.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = threading.Thread(target=tick)
        ticker.start()
        time.sleep(0.05)
        start = time.perf_counter()
        work()
        took = time.perf_counter() - start
        stop.set()
        ticker.join()
        return {"encode_s": round(took, 3), "worst_tick_gap_ms": round(max(gaps) * 1000, 1)}

    return {
        "chars": len(text),
        "encode": worst_gap(lambda: backend.encode(text).ids),
        "encode_batch": worst_gap(lambda: backend.encode_batch([text])[0].ids),
    }


def setup_platform(var_dir: Path, folder: Path) -> tuple[str, str]:
    """Migrate, import the base model, two tenants with an inference key each."""
    os.environ.update(
        LORAPLEX_VAR_DIR=str(var_dir),
        DJANGO_SETTINGS_MODULE="platform_site.settings",
        LORAPLEX_ENGINE="off",
    )
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    from registry.services.base_models import base_model_import
    from tenants.services import api_key_create, tenant_create

    call_command("migrate", verbosity=0)
    base_model_import(name=BASE, path=folder, default=True)
    keys = []
    for slug in ("attacker", "bystander"):
        tenant = tenant_create(slug=slug, name=slug.title())
        keys.append(api_key_create(tenant=tenant, name="bench", scopes=["inference"])[1])
    return keys[0], keys[1]


def start_server(root: Path, env: dict) -> tuple[str, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--log-level", "warning"],
        cwd=root,
        env=env,
    )
    import httpx

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("serve did not become ready")


def attack(
    url: str, key: str, path: str, body: bytes, loops: int, pace: float, seconds: float, results
) -> None:
    """The child process: `loops` clients POSTing `body` to `path` until the time is up, each
    starting a request at most once a `pace` seconds; puts (status counts, each request's
    seconds) on `results`."""
    import httpx

    async def run():
        statuses: dict[str, int] = {}
        took: list[float] = []
        deadline = time.monotonic() + seconds
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(timeout=300) as client:

            async def loop():
                while time.monotonic() < deadline:
                    start = time.monotonic()
                    try:
                        async with client.stream(
                            "POST", f"{url}{path}", content=body, headers=headers
                        ) as r:
                            async for _ in r.aiter_bytes():
                                pass  # read, never parsed: its size is the server's cost
                        status = str(r.status_code)
                    except httpx.HTTPError as exc:
                        status = type(exc).__name__
                    took.append(time.monotonic() - start)
                    statuses[status] = statuses.get(status, 0) + 1
                    await asyncio.sleep(max(0.0, start + pace - time.monotonic()))

            await asyncio.gather(*(loop() for _ in range(loops)))
        return statuses, took

    results.put(asyncio.run(run()))


async def probe(url: str, key: str, seconds: float) -> dict:
    """/healthz every HEALTHZ_EVERY and tenant B's chats back to back, for `seconds`."""
    import httpx

    healthz: list[float] = []
    chats: list[float] = []
    failures: list[str] = []
    deadline = time.monotonic() + seconds
    body = {
        "model": BASE,
        "messages": QUESTION,
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(timeout=300) as health, httpx.AsyncClient(timeout=300) as api:

        async def health_loop():
            while time.monotonic() < deadline:
                start = time.monotonic()
                response = await health.get(f"{url}/healthz")
                healthz.append(time.monotonic() - start)
                if response.status_code != 200:
                    failures.append(f"healthz {response.status_code}")
                await asyncio.sleep(HEALTHZ_EVERY)

        async def chat_loop():
            while time.monotonic() < deadline:
                start = time.monotonic()
                response = await api.post(
                    f"{url}/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                )
                chats.append(time.monotonic() - start)
                if response.status_code != 200:
                    failures.append(f"chat {response.status_code}: {response.text[:200]}")

        await asyncio.gather(health_loop(), chat_loop())
    return {"healthz": healthz, "chats": chats, "failures": failures}


def summary(values: list[float], scale: float = 1.0, digits: int = 3) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered) * scale, digits),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * scale, digits),
        "max": round(ordered[-1] * scale, digits),
    }


def phase(url: str, keys: tuple[str, str], seconds: float, attack_args=None) -> dict:
    """Probes for `seconds`, with the attackers' child process running beside them if any."""
    child, results = None, None
    if attack_args is not None:
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        child = ctx.Process(target=attack, args=(url, keys[0], *attack_args, seconds, results))
        child.start()
        time.sleep(1.0)  # the child's interpreter and first requests under way
    probed = asyncio.run(probe(url, keys[1], seconds))
    out = {
        "healthz_ms": summary(probed["healthz"], 1000, 1),
        "chat_s": summary(probed["chats"]),
        "failures": probed["failures"][:5],
    }
    if child is not None and results is not None:
        try:
            statuses, took = results.get(timeout=seconds + 600)
        except queue.Empty:
            raise SystemExit(
                f"the attackers' process ended without results ({child.exitcode})"
            ) from None
        child.join()
        out["attacker"] = {"status": statuses, "request_s": summary(took)}
    return out


def main():
    parser = bench_parser(__doc__, seconds=15.0, attackers=4, pace=1.0)
    parser.add_argument("--server-root", type=Path, default=ROOT)
    parser.add_argument("--server-env", default="", help="KEY=VALUE,... added to serve's env")
    args = parser.parse_args()
    folder = model_dir(args.model)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per probe
    from inference.engine.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(folder)
    megabyte = random_text(1_040_000)  # a body within the 1 MiB default limit
    gil = gil_held(folder, megabyte)
    with tempfile.TemporaryDirectory(prefix="tokenize-isolation-") as tmp:
        keys = setup_platform(Path(tmp), folder)
        env = {
            **os.environ,
            "LORAPLEX_ENGINE": "on",
            "LORAPLEX_BASE_MODEL": BASE,
            "LORAPLEX_VAR_DIR": tmp,
        }
        env |= dict(item.split("=", 1) for item in args.server_env.split(",") if item)
        url, proc = start_server(args.server_root, env)
        try:
            import httpx

            context = httpx.post(
                f"{url}/tokenize",
                json={"prompt": "hi"},
                headers={"Authorization": f"Bearer {keys[0]}"},
                timeout=60,
            ).json()["max_model_len"]
            at_limit = context * min(CHARS_PER_TOKEN, tokenizer.max_token_chars)
            bodies = {
                "tokenize_1mb": ("/tokenize", {"prompt": megabyte, "return_token_strs": True}),
                "chat_660k": ("/v1/chat/completions", _chat(random_text(660_000, seed=1))),
                "tokenize_at_limit": (
                    "/tokenize",
                    {"prompt": random_text(at_limit, seed=2), "return_token_strs": True},
                ),
                "chat_at_limit": (
                    "/v1/chat/completions",
                    _chat(random_text(at_limit - 1024, seed=3)),
                ),
            }
            loops = {"chat_660k": 6}
            phase(url, keys, 3.0)  # warm-up: the first chat compiles nothing, but loads caches
            figures: dict = {
                "model": str(folder.name),
                "max_model_len": context,
                "chars_at_limit": at_limit,
                "server_root": str(args.server_root),
                "server_env": args.server_env,
                "pace_s": args.pace,
                "gil": gil,
                "cpus": os.cpu_count(),
                "idle": phase(url, keys, args.seconds),
            }
            for name, (path, body) in bodies.items():
                raw = json.dumps(body).encode()
                figures[name] = phase(
                    url,
                    keys,
                    args.seconds,
                    (path, raw, loops.get(name, args.attackers), args.pace),
                )
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    idle_chat = figures["idle"]["chat_s"]["p50"]
    attacks = [name for name in bodies]
    for name in attacks:
        figures[name]["chat_ratio_p50"] = round(figures[name]["chat_s"]["p50"] / idle_chat, 2)
        figures[name]["chat_ratio_max"] = round(figures[name]["chat_s"]["max"] / idle_chat, 2)
    figures["goals"] = {
        "healthz_max_under_100ms": all(
            figures[n]["healthz_ms"]["max"] < HEALTHZ_GOAL_MS for n in attacks
        ),
        "chat_p50_within_1_5x_idle": all(
            figures[n]["chat_ratio_p50"] <= CHAT_GOAL_RATIO for n in attacks
        ),
    }
    for name in ("idle", *attacks):
        print(name, json.dumps(figures[name]), file=sys.stderr)
    print(json.dumps(figures))


def _chat(content: str) -> dict:
    return {"model": BASE, "messages": [{"role": "user", "content": content}], "max_tokens": 1}


if __name__ == "__main__":
    main()
