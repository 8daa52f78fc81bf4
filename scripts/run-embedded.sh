#!/usr/bin/env bash
# The embedded default: SQLite, filesystem broker, local object store, all under
# LORAPLEX_VAR_DIR; the engine in-process on CPU with the bundled SmolLM2. Runs the server
# and real Celery workers (one with beat, one for evaluations) in the foreground; Ctrl-C
# stops them all. The banner with the examples prints once the server answers /readyz and
# the demo adapters passed the gate.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
PY="$VENV/bin/python"
# Where this machine reaches the server: a wildcard HOST (every interface) through loopback.
case "$HOST" in
  0.0.0.0 | :: | '[::]') URL="http://127.0.0.1:$PORT" ;;
  *:*) URL="http://[$HOST]:$PORT" ;; # an IPv6 address
  *) URL="http://$HOST:$PORT" ;;
esac

"$PY" manage.py migrate --noinput
# The bundled SmolLM2 base model: converted and registered once; a revision imported since
# (manage.py demo_base_revision) is kept.
"$PY" manage.py import_base_model --preset smollm2-135m-instruct --if-missing
DEMO=$("$PY" manage.py bootstrap_demo)
echo "$DEMO"
KEY=$(echo "$DEMO" | tail -n 1)

# The worker reaches this process's engine (the quality gate's scoring, the admin's Engines
# page) with an operator token; unless one is given, both share a fresh one for this run.
export LORAPLEX_OPERATOR_TOKEN=${LORAPLEX_OPERATOR_TOKEN:-$("$PY" -c 'import secrets; print(secrets.token_urlsafe(32))')}
export LORAPLEX_ENGINE_URLS=${LORAPLEX_ENGINE_URLS:-$URL}
# A folder `load_lora_adapter` may register adapter files from by path (`lora_path`): the
# demo adapters', beside any given.
DEMO_LORAS="$PWD/registry/demo/adapters"
export LORAPLEX_LORA_PATH_ROOTS="${LORAPLEX_LORA_PATH_ROOTS:+$LORAPLEX_LORA_PATH_ROOTS,}$DEMO_LORAS"

# Two workers, so that an upload's validation never waits behind an eval set's scoring
# (platform_site/celery.py: a queue per kind of work). One takes validation, staging and the
# periodic tasks, one at a time; -B: it also runs Celery beat, which schedules the sweeps.
# The other scores evaluations, two at a time in threads (each mostly waits on the engine;
# one per tenant at a time), so one tenant's long evaluation leaves room for another's.
"$VENV/bin/celery" -A platform_site worker -B -P solo -Q celery,validation,staging \
  -n main@%h --loglevel INFO &
WORKER=$!
"$VENV/bin/celery" -A platform_site worker -P threads --concurrency 2 -Q evaluation \
  -n evaluation@%h --loglevel INFO &
EVALUATOR=$!
"$PY" manage.py serve --host "$HOST" --port "$PORT" &
SERVER=$!
stop() {
  kill -TERM "$SERVER" "$WORKER" "$EVALUATOR" 2>/dev/null || true
  wait "$SERVER" "$WORKER" "$EVALUATOR" 2>/dev/null || true
}
trap stop EXIT INT TERM

# Ready when /readyz answers 200 (database, broker and the engine's loop); if `serve` exits
# first, so does this script, with its status.
until "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
  "$URL/readyz" 2>/dev/null; do
  if ! kill -0 "$SERVER" 2>/dev/null; then
    wait "$SERVER" && status=0 || status=$?
    echo "serve exited (status $status) before it was ready" >&2
    exit "$status"
  fi
  sleep 1
done
# The demo tenant's trained adapters (registry/demo) with their eval sets: uploaded, measured
# by the worker on this engine (the quality gate), then promoted.
"$PY" manage.py demo_adapters --wait 900

cat <<BANNER

Loraplex is ready on $URL/
$(echo "$DEMO" | grep -E '^(Demo tenant|Operator)' | sed 's/^/  /')
  Web UI $URL/login/ · admin $URL/admin/ · API docs $URL/api/docs/
  For the README's examples, in another shell:

  export KEY=$KEY
  export LORAPLEX_OPERATOR_TOKEN=$LORAPLEX_OPERATOR_TOKEN

  curl $URL/v1/chat/completions \\
    -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \\
    -d '{"model": "demo-pirate", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0}'

  $PY - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="$URL/v1", api_key="$KEY")
for model in ("smollm2-135m-instruct", "demo-french", "demo-json", "demo-pirate"):
    reply = client.chat.completions.create(model=model, max_tokens=32, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    print(model, "->", reply.choices[0].message.content)
PY

  curl $URL/v1/load_lora_adapter \\
    -H "Authorization: Bearer $LORAPLEX_OPERATOR_TOKEN" -H "Content-Type: application/json" \\
    -d '{"lora_name": "demo/demo-pirate", "lora_path": "$DEMO_LORAS/demo-pirate"}'

BANNER
wait "$SERVER"
