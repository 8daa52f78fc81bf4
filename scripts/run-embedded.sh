#!/usr/bin/env bash
# The embedded default: SQLite, filesystem broker, local object store, all under
# LORAPLEX_VAR_DIR; the engine in-process on CPU with the bundled SmolLM2. Runs the server
# and a real Celery worker (with beat) in the foreground; Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
PY="$VENV/bin/python"

"$PY" manage.py migrate --noinput
# The bundled SmolLM2 base model: converted and registered once, a no-op afterwards.
"$PY" manage.py import_base_model --preset smollm2-135m-instruct
DEMO=$("$PY" manage.py bootstrap_demo)
echo "$DEMO"
KEY=$(echo "$DEMO" | tail -n 1)
# The demo tenant's trained adapters (registry/demo): demo-french, demo-json, demo-pirate.
"$PY" manage.py demo_adapters

# The worker reaches this process's engine (the quality gate's scoring, the admin's Engines
# page) with an operator token; unless one is given, both share a fresh one for this run.
export LORAPLEX_OPERATOR_TOKEN=${LORAPLEX_OPERATOR_TOKEN:-$("$PY" -c 'import secrets; print(secrets.token_urlsafe(32))')}
export LORAPLEX_ENGINE_URLS=${LORAPLEX_ENGINE_URLS:-http://$HOST:$PORT}

# -B: the same process runs Celery beat, which schedules the registry's periodic sweep.
"$VENV/bin/celery" -A platform_site worker -B -P solo --loglevel INFO &
WORKER=$!
trap 'kill -TERM "$WORKER" 2>/dev/null || true; wait "$WORKER" 2>/dev/null || true' EXIT INT TERM

cat <<BANNER

Loraplex is starting on http://$HOST:$PORT/  (web UI sign-in and API docs: see README)

  curl http://$HOST:$PORT/v1/chat/completions \\
    -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \\
    -d '{"model": "demo-pirate", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32}'

  $PY - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="http://$HOST:$PORT/v1", api_key="$KEY")
for model in ("smollm2-135m-instruct", "demo-french", "demo-json", "demo-pirate"):
    reply = client.chat.completions.create(model=model, max_tokens=32,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    print(model, "->", reply.choices[0].message.content)
PY

BANNER
"$PY" manage.py serve --host "$HOST" --port "$PORT"
