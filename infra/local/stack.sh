#!/usr/bin/env bash
# A local stack: Prefect server (UI on :4200), an S3-compatible store (moto's server on :9000, bucket
# rlvr-lake), the `rlvr` process work pool with $WORKERS workers (default 1), and `rlvr serve` for the
# deployments. PREFECT_DB=postgres keeps Prefect's database in PostgreSQL (Debian's package, started
# here by infra/local/postgres.sh on :$PG_PORT, default 5433) instead of SQLite: what a team runs.
#
#   infra/local/stack.sh start     # then: source infra/local/env.sh
#   PREFECT_DB=postgres WORKERS=2 RLVR_TORCH_THREADS=1 infra/local/stack.sh start
#       # Prefect on PostgreSQL, two workers, the overlapped loop's two roles deployed to them
#       # (then: rlvr run --config configs/async-workers.yaml)
#   infra/local/stack.sh status
#   infra/local/stack.sh stop      # serve and the workers first, then the server (Prefect's advice)
#
# Logs and pids go to $STACK_DIR (default .stack/ in the repository). The lake is s3://rlvr-lake/dev.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=${BIN:-$ROOT/.venv/bin}
STACK_DIR=${STACK_DIR:-$ROOT/.stack}
PREFECT_PORT=${PREFECT_PORT:-4200}
S3_PORT=${S3_PORT:-9000}
PG_PORT=${PG_PORT:-5433}
PREFECT_DB=${PREFECT_DB:-sqlite}
WORKERS=${WORKERS:-1}
mkdir -p "$STACK_DIR"

cat > "$ROOT/infra/local/env.sh" <<ENV
export PREFECT_API_URL=http://127.0.0.1:$PREFECT_PORT/api
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export AWS_ENDPOINT_URL=http://127.0.0.1:$S3_PORT AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=eu-west-1
export AWS_ALLOW_HTTP=true
export RLVR_LAKE=s3://rlvr-lake/dev
export RLVR_HOME=$ROOT
ENV
# shellcheck disable=SC1091
source "$ROOT/infra/local/env.sh"

start_one() {   # name, command...
  local name=$1; shift
  if [[ -f $STACK_DIR/$name.pid ]] && kill -0 "$(cat "$STACK_DIR/$name.pid")" 2>/dev/null; then
    echo "$name: already running (pid $(cat "$STACK_DIR/$name.pid"))"; return
  fi
  setsid "$@" > "$STACK_DIR/$name.log" 2>&1 &
  echo $! > "$STACK_DIR/$name.pid"
  echo "$name: started (pid $!, log $STACK_DIR/$name.log)"
}

wait_http() {   # url, what
  for _ in $(seq 60); do curl -fsS "$1" > /dev/null 2>&1 && return; sleep 1; done
  echo "$2 did not come up at $1; see $STACK_DIR" >&2; exit 1
}

stop_one() {
  local pid_file=$STACK_DIR/$1.pid
  [[ -f $pid_file ]] || return 0
  kill -INT -- "-$(cat "$pid_file")" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$(cat "$pid_file")" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$(cat "$pid_file")" 2>/dev/null || true
  rm -f "$pid_file"; echo "$1: stopped"
}

case ${1:-start} in
  start)
    if [[ $PREFECT_DB == postgres ]]; then
      PREFECT_API_DATABASE_CONNECTION_URL=$("$ROOT/infra/local/postgres.sh" start "$STACK_DIR/postgres" "$PG_PORT")
      export PREFECT_API_DATABASE_CONNECTION_URL
      echo "postgres: $PREFECT_API_DATABASE_CONNECTION_URL (log $STACK_DIR/postgres/postgres.log)"
    fi
    start_one prefect-server "$BIN/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT"
    start_one s3 "$BIN/moto_server" -H 127.0.0.1 -p "$S3_PORT"
    wait_http "$PREFECT_API_URL/health" "the Prefect server"
    wait_http "$AWS_ENDPOINT_URL" "the S3 server"
    "$BIN/python" -c "from storage.location import s3_filesystem; fs = s3_filesystem(); \
fs.exists('rlvr-lake') or fs.mkdir('rlvr-lake')"
    "$BIN/prefect" work-pool inspect rlvr > /dev/null 2>&1 || "$BIN/prefect" work-pool create rlvr --type process
    if (( WORKERS >= 2 )); then       # the overlapped loop's two roles, for loop.roles: deployments
      RLVR_HOME=$ROOT "$BIN/prefect" --no-prompt deploy --name rollout-producer/async --name policy-trainer/async \
        > "$STACK_DIR/deploy.log" 2>&1 || { tail -n 20 "$STACK_DIR/deploy.log" >&2; exit 1; }
      echo "deployments rollout-producer/async, policy-trainer/async: on the rlvr pool"
    fi
    for n in $(seq "$WORKERS"); do     # --limit 1: each worker runs one flow run at a time
      start_one "worker-$n" "$BIN/prefect" worker start --pool rlvr --name "rlvr-worker-$n" --limit 1
    done
    start_one serve "$BIN/rlvr" serve --config configs/deployments.yaml
    echo "UI: http://127.0.0.1:$PREFECT_PORT  |  source infra/local/env.sh  |  lake: $RLVR_LAKE"
    ;;
  status)
    for name in serve $(cd "$STACK_DIR" && ls worker-*.pid 2>/dev/null | sed 's/.pid$//') s3 prefect-server; do
      if [[ -f $STACK_DIR/$name.pid ]] && kill -0 "$(cat "$STACK_DIR/$name.pid")" 2>/dev/null; then
        echo "$name: running (pid $(cat "$STACK_DIR/$name.pid"))"; else echo "$name: stopped"; fi
    done
    ;;
  stop)
    for name in serve $(cd "$STACK_DIR" && ls worker-*.pid 2>/dev/null | sed 's/.pid$//') s3 prefect-server; do
      stop_one "$name"
    done
    "$ROOT/infra/local/postgres.sh" stop "$STACK_DIR/postgres"
    ;;
  *) echo "usage: $0 start|status|stop" >&2; exit 2 ;;
esac
