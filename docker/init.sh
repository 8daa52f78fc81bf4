#!/usr/bin/env bash
# One-shot start-up work, before web, worker and engine start (compose's `init` service):
# migrate, create the object-storage bucket if missing, import the base model.
# Natively: `bash docker/init.sh` with the same environment (.env.example's variables).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

"$PY" manage.py migrate --noinput

if [ -n "${LORAPLEX_S3_BUCKET:-}" ]; then
  "$PY" - <<'PY'
import os

import boto3
from botocore.exceptions import ClientError

bucket = os.environ["LORAPLEX_S3_BUCKET"]
s3 = boto3.client(
    "s3",
    endpoint_url=os.environ.get("AWS_S3_ENDPOINT_URL") or None,
    region_name=os.environ.get("AWS_S3_REGION_NAME", "us-east-1"),
)
try:
    s3.head_bucket(Bucket=bucket)
    print(f"bucket {bucket} exists")
except ClientError:
    s3.create_bucket(Bucket=bucket)
    print(f"created bucket {bucket}")
PY
fi

# The base model the engine serves: a bundled preset, converted once into LORAPLEX_MODELS_DIR
# (a volume the engine shares), or a Hugging Face folder you mount (LORAPLEX_BASE_MODEL_DIR).
if [ -n "${LORAPLEX_BASE_MODEL_DIR:-}" ]; then
  "$PY" manage.py import_base_model --hf-dir "$LORAPLEX_BASE_MODEL_DIR" \
    --name "${LORAPLEX_BASE_MODEL:?set LORAPLEX_BASE_MODEL to the model name}"
else
  "$PY" manage.py import_base_model --preset "${LORAPLEX_BASE_MODEL:-smollm2-135m-instruct}"
fi
