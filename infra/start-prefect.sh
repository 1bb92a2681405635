#!/usr/bin/env bash
# A Prefect server (API + UI) without Docker, in the foreground (Ctrl-C stops it).
#
#   infra/start-prefect.sh
#   PREFECT_PORT=4300 infra/start-prefect.sh
#   PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://user:pw@db:5432/prefect infra/start-prefect.sh
#
# Variables (defaults): PREFECT_HOST (127.0.0.1; 0.0.0.0 serves other machines: there is no login, and set
# PREFECT_UI_API_URL=http://<name>:<port>/api so browsers find the API), PREFECT_PORT (4200), PREFECT_HOME
# (~/.prefect: the sqlite database lives there unless PREFECT_API_DATABASE_CONNECTION_URL names Postgres).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOST="${PREFECT_HOST:-127.0.0.1}"
PORT="${PREFECT_PORT:-4200}"
export PREFECT_SERVER_ANALYTICS_ENABLED="${PREFECT_SERVER_ANALYTICS_ENABLED:-false}"
unset PREFECT_API_URL   # this process is the server, not a client of another one
if [ -x .venv/bin/prefect ]; then PREFECT=.venv/bin/prefect; else PREFECT="$(command -v prefect)" || {
  echo "prefect not found: run 'make setup' (creates .venv) or install prefect" >&2; exit 1; }; fi

cat <<MSG
Prefect UI: http://${HOST}:${PORT}   API: http://${HOST}:${PORT}/api
Point the pipeline, workers and deployments at it, in every shell that runs them:
  export PREFECT_API_URL=http://${HOST}:${PORT}/api
MSG
exec "$PREFECT" server start --host "$HOST" --port "$PORT"
