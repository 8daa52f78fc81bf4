#!/usr/bin/env bash
# The embedded default: SQLite, filesystem broker, local object store, all under
# LORAPLEX_VAR_DIR. Runs the web server and a real Celery worker in the foreground;
# Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}

"$VENV/bin/python" manage.py migrate --noinput
# The bundled SmolLM2 base model: converted and registered once, a no-op afterwards.
"$VENV/bin/python" manage.py import_base_model --preset smollm2-135m-instruct
DEMO=$("$VENV/bin/python" manage.py bootstrap_demo)
echo "$DEMO"
KEY=$(echo "$DEMO" | tail -n 1)

# -B: the same process runs Celery beat, which schedules the registry's periodic sweep.
"$VENV/bin/celery" -A platform_site worker -B -P solo --loglevel INFO &
WORKER=$!
trap 'kill -TERM "$WORKER" 2>/dev/null || true; wait "$WORKER" 2>/dev/null || true' EXIT INT TERM

cat <<BANNER

Loraplex is starting on http://$HOST:$PORT/
  curl -H "Authorization: Bearer $KEY" http://$HOST:$PORT/api/v1/tenant/
  API docs: http://$HOST:$PORT/api/docs/    admin: http://$HOST:$PORT/admin/

BANNER
"$VENV/bin/uvicorn" platform_site.asgi:application --host "$HOST" --port "$PORT"
