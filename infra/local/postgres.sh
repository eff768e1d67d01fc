#!/usr/bin/env bash
# PostgreSQL for Prefect's database, from Debian's `postgresql` package: a cluster of its own in DIR,
# listening on 127.0.0.1:PORT only (trust authentication on loopback), with a database `prefect`.
#
#   infra/local/postgres.sh start DIR PORT   # prints the URL for PREFECT_API_DATABASE_CONNECTION_URL
#   infra/local/postgres.sh stop DIR
#
# Run as root, the server runs as the package's `postgres` user (PostgreSQL refuses root), so DIR must
# be a folder that user can reach (not under a 0700 home or pytest's tmp_path).
set -euo pipefail
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
if [[ -z $PG_BIN || ! -x $PG_BIN/initdb ]]; then
  echo "PostgreSQL is not installed: apt-get install postgresql (Debian's package), or set PG_BIN" >&2; exit 3
fi
as_owner() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

command=${1:-}; dir=${2:-}
[[ -n $dir ]] || { echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2; }
case $command in
  start)
    port=${3:?usage: $0 start DIR PORT}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [[ $(id -u) == 0 ]] && chown postgres: "$dir"
    if [[ ! -f $dir/data/PG_VERSION ]]; then
      as_owner "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 > "$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    if ! as_owner "$PG_BIN/pg_ctl" -D "$dir/data" status > /dev/null 2>&1; then
      as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200" start > /dev/null \
        || { tail -n 20 "$dir/postgres.log" >&2; exit 1; }
    fi
    if ! as_owner "$PG_BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -Atc \
        "select 1 from pg_database where datname = 'prefect'" postgres | grep -q 1; then
      as_owner "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres prefect
    fi
    echo "postgresql+asyncpg://postgres@127.0.0.1:$port/prefect"
    ;;
  stop)
    [[ -f $dir/data/PG_VERSION ]] || exit 0
    as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w stop > /dev/null 2>&1 || true
    ;;
  *) echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2 ;;
esac
