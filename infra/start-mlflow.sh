#!/usr/bin/env bash
# An MLflow tracking server without Docker, in the foreground (Ctrl-C stops it). Run from anywhere: it works in
# the repo root, so the default store is the pipeline's own sqlite:///mlflow.db.
#
#   infra/start-mlflow.sh
#   MLFLOW_PORT=5100 MLFLOW_BACKEND_STORE_URI=postgresql+psycopg2://user:pw@db:5432/mlflow infra/start-mlflow.sh
#
# Variables (defaults): MLFLOW_HOST (127.0.0.1; 0.0.0.0 serves other machines: there is no login, put a proxy
# with auth in front), MLFLOW_PORT (5000), MLFLOW_BACKEND_STORE_URI (sqlite:///mlflow.db; MLflow 3 refuses a
# plain folder), MLFLOW_ARTIFACTS_DESTINATION (./mlartifacts; or s3://bucket with AWS_* and
# MLFLOW_S3_ENDPOINT_URL set, needs boto3), MLFLOW_WORKERS (1: more than one fails on some machines).
# The store's password is never printed (shown as user:***@) and never put on the command line (`ps` shows
# that): mlflow reads the store from MLFLOW_BACKEND_STORE_URI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOST="${MLFLOW_HOST:-127.0.0.1}"
PORT="${MLFLOW_PORT:-5000}"
STORE="${MLFLOW_BACKEND_STORE_URI:-sqlite:///mlflow.db}"
ARTIFACTS="${MLFLOW_ARTIFACTS_DESTINATION:-./mlartifacts}"
WORKERS="${MLFLOW_WORKERS:-1}"
SHOWN_STORE="$(printf '%s' "$STORE" | sed -E 's#(://[^:/@[:space:]]*):[^@/[:space:]]*@#\1:***@#')"
if [ -x .venv/bin/mlflow ]; then MLFLOW=.venv/bin/mlflow; else MLFLOW="$(command -v mlflow)" || {
  echo "mlflow not found: run 'make setup' (creates .venv) or install mlflow" >&2; exit 1; }; fi
PYTHON="$(dirname "$MLFLOW")/python"; [ -x "$PYTHON" ] || PYTHON=python3

# a taken port: mlflow printed nothing useful and this script exited 0 about 30 s later, after the banner
"$PYTHON" - "$HOST" "$PORT" <<'PY' || exit 1
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: a TIME_WAIT is not "in use"
    try:
        probe.bind((host, port))
    except OSError as err:
        sys.exit(f"start-mlflow.sh: port {port} on {host} cannot be bound ({err.strerror}); stop what holds it "
                 "or pick another port (MLFLOW_PORT=5100 infra/start-mlflow.sh)")
PY

cat <<MSG
MLflow UI and API: http://${HOST}:${PORT}   (store ${SHOWN_STORE}, artifacts ${ARTIFACTS})
Point the pipeline at it, in params.yaml:   tracking: {uri: http://${HOST}:${PORT}}
(or keep tracking.uri: ${SHOWN_STORE}: the pipeline writes the store directly and this UI reads it)
MSG
export MLFLOW_BACKEND_STORE_URI="$STORE"
exec "$MLFLOW" server --host "$HOST" --port "$PORT" --workers "$WORKERS" --artifacts-destination "$ARTIFACTS"
