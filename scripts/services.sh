#!/usr/bin/env bash
# Test services for Chorus: three moto S3 servers (one per "zone"), an Azurite
# blob server (Azure Blob Storage emulator), a throwaway PostgreSQL cluster and
# a single-member etcd (the oracle of the etcd API tests), all on loopback.
#
#   bash scripts/services.sh start   # idempotent; writes .ci/state/env
#   bash scripts/services.sh stop    # kills everything, removes the pg data dir
#   bash scripts/services.sh env     # prints the export lines
#   bash scripts/services.sh status
#
# Everything needed is installed by this script (CI runs on a fresh machine):
# moto goes into a virtualenv under .ci/state/venv (gitignored), PostgreSQL
# comes from Debian's packages if no initdb/pg_ctl is found, Azurite from the
# npm registry into .ci/state/azurite, etcd and etcdctl from Debian's
# etcd-server and etcd-client, and protoc from protobuf-compiler (the build
# script of the `etcd-client` crate, a dev-dependency, runs it; the product
# itself builds without one, which scripts/test.sh checks before this runs).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.ci/state"
VENV="$STATE/venv"
ENV_FILE="$STATE/env"

# Exact pin: newest moto 5.x verified to enforce If-None-Match / If-Match on
# PutObject. Its deps (flask, werkzeug, boto3) need no pins for this.
MOTO_VERSION="5.2.5"

# moto's own `moto_server` checks conditional PUTs non-atomically under
# concurrent requests; this launcher serializes requests (see its docstring).
MOTO_SCRIPT="serialized_moto_server.py"

MOTO_HOST="127.0.0.1"
ZONES=(a b c)
MOTO_PORTS=(5101 5102 5103)
BUCKET_PREFIX="chorus-zone-"

# Azurite: pinned; in memory; --skipApiVersionCheck because the Azure SDK that
# creates the container may speak a newer API version than Azurite knows.
AZURITE_VERSION="3.37.0"
AZURE_BLOB_SDK_VERSION="12.31.1"
AZURITE_DIR="$STATE/azurite"
AZURITE_HOST="127.0.0.1"
AZURITE_PORT=10000  # the port object_store's emulator mode expects
AZURE_CONTAINER="chorus-az"

# The virtualenv holds exactly these versions when this file exists.
VENV_MARKER="$VENV/.moto-$MOTO_VERSION-azure-blob-$AZURE_BLOB_SDK_VERSION"

PG_PORT=5499
PG_DB="chorus_test"
PG_OS_USER="postgres"
# Outside the repo on purpose: initdb refuses to run as root, and the
# postgres OS user may not be able to traverse the directory CI clones into.
PG_ROOT="/tmp/chorus-ci-pg-$PG_PORT"
PG_DATA="$PG_ROOT/data"
PG_LOG="$PG_ROOT/postgres.log"

# etcd: one member on loopback. Not 2379/2380, etcd's defaults: `chorus
# serve` answers etcd clients on 127.0.0.1:2379 by default, and a developer's
# own etcd may hold them.
ETCD_HOST="127.0.0.1"
ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
ETCD_NAME="chorus-test"
ETCD_DATA="$STATE/etcd"

WAIT_SECS="${CHORUS_SERVICES_WAIT_SECS:-60}"

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

pid_alive() { [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null; }

joined() { local IFS=,; echo "$*"; }

endpoints() {
  local out=() p
  for p in "${MOTO_PORTS[@]}"; do out+=("http://$MOTO_HOST:$p"); done
  joined "${out[@]}"
}

buckets() {
  local out=() z
  for z in "${ZONES[@]}"; do out+=("$BUCKET_PREFIX$z"); done
  joined "${out[@]}"
}

env_lines() {
  cat <<EOF
export CHORUS_TEST_S3_ENDPOINTS="$(endpoints)"
export CHORUS_TEST_S3_BUCKETS="$(buckets)"
export AWS_ACCESS_KEY_ID="testing"
export AWS_SECRET_ACCESS_KEY="testing"
export AWS_DEFAULT_REGION="us-east-1"
export CHORUS_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$PG_PORT/$PG_DB"
export AZURE_STORAGE_USE_EMULATOR="true"
export CHORUS_TEST_AZURE_CONTAINER="$AZURE_CONTAINER"
export CHORUS_TEST_ETCD_ENDPOINT="$(etcd_endpoint)"
export CHORUS_TEST_ETCD_BIN="$(command -v etcd || true)"
export CHORUS_TEST_ETCDCTL_BIN="$(command -v etcdctl || true)"
EOF
}

etcd_endpoint() { echo "http://$ETCD_HOST:$ETCD_CLIENT_PORT"; }

# ----------------------------------------------------------- packages ----

# apt_install PKG...: install Debian packages (CI runs as root on a fresh machine).
apt_install() {
  [[ "$(id -u)" == 0 ]] || die "missing $*: install them (we are not root to apt-get them)"
  log "installing Debian packages: $*"
  export DEBIAN_FRONTEND=noninteractive
  if [[ -z "${APT_UPDATED:-}" ]]; then apt-get update -qq; APT_UPDATED=1; fi
  apt-get install -y -qq "$@" >/dev/null
}

# The tools the services and the tests need besides Rust: curl (readiness
# checks), python3 with venv (moto), a C++ compiler (libfuzzer-sys, built when
# the fuzz targets are checked), etcd and etcdctl (the etcd API's oracle),
# protoc (the `etcd-client` dev-dependency's build script).
ensure_tools() {
  local missing=()
  command -v curl >/dev/null || missing+=(curl)
  command -v python3 >/dev/null || missing+=(python3)
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
  command -v c++ >/dev/null || missing+=(g++)
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v etcdctl >/dev/null || missing+=(etcd-client)
  command -v protoc >/dev/null || missing+=(protobuf-compiler)
  if ((${#missing[@]})); then apt_install "${missing[@]}"; fi
}

# ---------------------------------------------------------------- moto ----

ensure_venv() {
  if [[ -x "$VENV/bin/moto_server" && -f "$VENV_MARKER" ]]; then
    return
  fi
  log "creating virtualenv $VENV with moto[server]==$MOTO_VERSION, azure-storage-blob==$AZURE_BLOB_SDK_VERSION"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-input \
    "moto[server]==$MOTO_VERSION" "azure-storage-blob==$AZURE_BLOB_SDK_VERSION"
  touch "$VENV_MARKER"
}

start_moto() {
  local i zone port pidfile logf pid bucket code
  for i in "${!ZONES[@]}"; do
    zone="${ZONES[$i]}"; port="${MOTO_PORTS[$i]}"
    pidfile="$STATE/moto-$zone.pid"; logf="$STATE/moto-$zone.log"
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    # Tests of older checkouts SIGSTOPped these servers, and one killed
    # mid-run may have left a server frozen: it still accepts connections
    # but never answers. (Tests now stop only moto servers of their own.)
    if pid_alive "$pid" && grep -q moto_server "/proc/$pid/cmdline" 2>/dev/null; then
      kill -CONT "$pid" 2>/dev/null || true
      # One started by an older version of this script, without serialized
      # requests: replace it.
      if ! grep -q "$MOTO_SCRIPT" "/proc/$pid/cmdline"; then
        log "replacing moto zone $zone (pid $pid): not started with $MOTO_SCRIPT"
        kill_wait "$pid"
      fi
    fi
    if pid_alive "$pid" && port_open "$MOTO_HOST" "$port"; then
      log "moto zone $zone already running (pid $pid, port $port)"
    else
      port_open "$MOTO_HOST" "$port" &&
        die "port $port is taken by a process not started by this script"
      log "starting moto zone $zone on $MOTO_HOST:$port (log $logf)"
      # setsid: detach from the caller's process group so the server outlives
      # the shell that started it (developers keep them running).
      setsid "$VENV/bin/python" "$ROOT/scripts/$MOTO_SCRIPT" -H "$MOTO_HOST" -p "$port" \
        >"$logf" 2>&1 </dev/null &
      echo $! >"$pidfile"
    fi
  done

  for i in "${!ZONES[@]}"; do
    zone="${ZONES[$i]}"; port="${MOTO_PORTS[$i]}"
    wait_for "moto zone $zone" "$STATE/moto-$zone.log" \
      curl -sf -o /dev/null "http://$MOTO_HOST:$port/"
    # Create the zone's bucket if missing. Unsigned requests are fine for
    # moto (signatures are not checked); HEAD first keeps this idempotent.
    bucket="$BUCKET_PREFIX$zone"
    if ! curl -sf -o /dev/null -I "http://$MOTO_HOST:$port/$bucket"; then
      code="$(curl -s -o /dev/null -w '%{http_code}' -X PUT \
        "http://$MOTO_HOST:$port/$bucket")"
      [[ "$code" == 200 ]] || die "creating bucket $bucket on port $port: HTTP $code"
      log "created bucket $bucket on port $port"
    fi
  done
}

stop_moto() {
  local zone pidfile pid
  for zone in "${ZONES[@]}"; do
    pidfile="$STATE/moto-$zone.pid"
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    # Only kill the pid if it still is a moto server (pids get reused); this
    # matches moto's own moto_server too, as older versions of this script ran it.
    if pid_alive "$pid" && grep -q moto_server "/proc/$pid/cmdline" 2>/dev/null; then
      log "stopping moto zone $zone (pid $pid)"
      kill -CONT "$pid" 2>/dev/null || true  # a frozen one acts on SIGTERM only once resumed
      kill_wait "$pid"
    fi
    rm -f "$pidfile"
  done
}

# ------------------------------------------------------------ azurite ----

ensure_azurite() {
  local marker="$AZURITE_DIR/.azurite-$AZURITE_VERSION"
  if [[ -x "$AZURITE_DIR/node_modules/.bin/azurite-blob" && -f "$marker" ]]; then
    return
  fi
  command -v npm >/dev/null || apt_install nodejs npm
  log "installing azurite@$AZURITE_VERSION into $AZURITE_DIR"
  rm -rf "$AZURITE_DIR"
  mkdir -p "$AZURITE_DIR"
  npm install --prefix "$AZURITE_DIR" --no-audit --no-fund --loglevel=error \
    "azurite@$AZURITE_VERSION" >/dev/null
  touch "$marker"
}

start_azurite() {
  local pidfile="$STATE/azurite.pid" logf="$STATE/azurite.log" pid
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  if pid_alive "$pid" && port_open "$AZURITE_HOST" "$AZURITE_PORT"; then
    log "azurite already running (pid $pid, port $AZURITE_PORT)"
  else
    port_open "$AZURITE_HOST" "$AZURITE_PORT" &&
      die "port $AZURITE_PORT is taken by a process not started by this script"
    log "starting azurite on $AZURITE_HOST:$AZURITE_PORT (log $logf)"
    setsid "$AZURITE_DIR/node_modules/.bin/azurite-blob" --inMemoryPersistence \
      --blobHost "$AZURITE_HOST" --blobPort "$AZURITE_PORT" --skipApiVersionCheck \
      >"$logf" 2>&1 </dev/null &
    echo $! >"$pidfile"
  fi
  wait_for "azurite" "$logf" port_open "$AZURITE_HOST" "$AZURITE_PORT"
  # object_store cannot create containers; the Azure SDK can (idempotently).
  "$VENV/bin/python" - "$AZURE_CONTAINER" <<'PY' || die "creating the Azurite container failed"
import sys
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient
client = BlobServiceClient.from_connection_string("UseDevelopmentStorage=true")
try:
    client.create_container(sys.argv[1])
except ResourceExistsError:
    pass
PY
}

stop_azurite() {
  local pidfile="$STATE/azurite.pid" pid
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  if pid_alive "$pid" && grep -q azurite "/proc/$pid/cmdline" 2>/dev/null; then
    log "stopping azurite (pid $pid)"
    kill_wait "$pid"
  fi
  rm -f "$pidfile"
}

# ----------------------------------------------------------- postgres ----

find_pg_bin() {
  local d
  if d="$(command -v initdb 2>/dev/null)" && [[ -x "$(dirname "$(readlink -f "$d")")/pg_ctl" ]]; then
    dirname "$(readlink -f "$d")"; return 0
  fi
  # Debian keeps the server binaries off PATH, in /usr/lib/postgresql/N/bin.
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]] && { echo "$d"; return 0; }
  return 1
}

ensure_postgres() {
  if PG_BIN="$(find_pg_bin)"; then return; fi
  log "PostgreSQL not found"
  apt_install postgresql
  PG_BIN="$(find_pg_bin)" || die "postgresql installed but initdb/pg_ctl not found"
}

# Run a command as the postgres OS user (initdb/postgres refuse to run as root).
as_pg() {
  if [[ "$(id -u)" == 0 ]]; then
    (cd "$PG_ROOT" && runuser -u "$PG_OS_USER" -- "$@")
  else
    (cd "$PG_ROOT" && "$@")
  fi
}

pg_psql() {
  "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres "$@"
}

start_postgres() {
  ensure_postgres
  if [[ "$(id -u)" == 0 ]] && ! id "$PG_OS_USER" >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/postgresql --shell /bin/bash "$PG_OS_USER"
  fi

  if [[ -f "$PG_DATA/PG_VERSION" ]] && as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
    log "postgres already running ($PG_DATA, port $PG_PORT)"
  else
    port_open 127.0.0.1 "$PG_PORT" &&
      die "port $PG_PORT is taken by a process not started by this script"
    # Throwaway cluster: anything left from an earlier run is discarded.
    rm -rf "$PG_ROOT"
    mkdir -p "$PG_ROOT"
    [[ "$(id -u)" == 0 ]] && chown "$PG_OS_USER": "$PG_ROOT"
    chmod 700 "$PG_ROOT"
    log "initdb $PG_DATA ($PG_BIN)"
    as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth=trust \
      -E UTF8 --no-locale --no-sync >"$STATE/initdb.log" 2>&1 ||
      { cat "$STATE/initdb.log" >&2; die "initdb failed"; }
    log "starting postgres on 127.0.0.1:$PG_PORT (log $PG_LOG)"
    # fsync etc. off: a test cluster that is thrown away needs no durability.
    # setsid: keep the postmaster out of the caller's process group.
    as_pg setsid "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t "$WAIT_SECS" -o \
      "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories='$PG_ROOT' -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
      start >/dev/null ||
      { tail -n 30 "$PG_LOG" >&2 || true; die "postgres failed to start"; }
  fi

  wait_for "postgres" "$PG_LOG" "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"
  if [[ "$(pg_psql -d postgres -tAc "select 1 from pg_database where datname = '$PG_DB'")" != 1 ]]; then
    pg_psql -d postgres -c "create database $PG_DB"
    log "created database $PG_DB"
  fi
  [[ "$(pg_psql -d "$PG_DB" -tAc 'select 1')" == 1 ]] || die "cannot query $PG_DB"
}

stop_postgres() {
  local pid
  PG_BIN="$(find_pg_bin || true)"
  if [[ -f "$PG_DATA/postmaster.pid" ]]; then
    log "stopping postgres ($PG_DATA)"
    if [[ -n "$PG_BIN" ]]; then
      as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 30 stop >/dev/null 2>&1 || true
    fi
    # Fallback if pg_ctl could not stop it.
    pid="$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)"
    if pid_alive "$pid"; then kill_wait "$pid"; fi
  fi
  rm -rf "$PG_ROOT"
}

# --------------------------------------------------------------- etcd ----

etcdctl_here() {
  ETCDCTL_API=3 etcdctl --endpoints "$(etcd_endpoint)" --dial-timeout 2s --command-timeout 5s "$@"
}

start_etcd() {
  local pidfile="$STATE/etcd.pid" logf="$STATE/etcd.log" pid
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  if pid_alive "$pid" && grep -q etcd "/proc/$pid/cmdline" 2>/dev/null &&
    port_open "$ETCD_HOST" "$ETCD_CLIENT_PORT"; then
    log "etcd already running (pid $pid, port $ETCD_CLIENT_PORT)"
  else
    port_open "$ETCD_HOST" "$ETCD_CLIENT_PORT" &&
      die "port $ETCD_CLIENT_PORT is taken by a process not started by this script"
    port_open "$ETCD_HOST" "$ETCD_PEER_PORT" &&
      die "port $ETCD_PEER_PORT is taken by a process not started by this script"
    # Throwaway member: a data dir left by an earlier run is discarded, so
    # every start is a fresh cluster at revision 1.
    rm -rf "$ETCD_DATA"
    log "starting $(etcd --version | head -n 1) on $(etcd_endpoint) (log $logf)"
    # setsid: keep etcd out of the caller's process group, like the others.
    setsid etcd --name "$ETCD_NAME" --data-dir "$ETCD_DATA" \
      --listen-client-urls "$(etcd_endpoint)" --advertise-client-urls "$(etcd_endpoint)" \
      --listen-peer-urls "http://$ETCD_HOST:$ETCD_PEER_PORT" \
      --initial-advertise-peer-urls "http://$ETCD_HOST:$ETCD_PEER_PORT" \
      --initial-cluster "$ETCD_NAME=http://$ETCD_HOST:$ETCD_PEER_PORT" \
      --initial-cluster-state new --logger zap --log-outputs stderr \
      >"$logf" 2>&1 </dev/null &
    echo $! >"$pidfile"
  fi
  wait_for "etcd" "$logf" etcdctl_here endpoint health
}

stop_etcd() {
  local pidfile="$STATE/etcd.pid" pid
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  # Only a pid that still is an etcd (pids get reused).
  if pid_alive "$pid" && grep -q etcd "/proc/$pid/cmdline" 2>/dev/null; then
    log "stopping etcd (pid $pid)"
    kill_wait "$pid"
  fi
  rm -f "$pidfile"
  rm -rf "$ETCD_DATA"
}

# ------------------------------------------------------------- helpers ----

# wait_for NAME LOGFILE CMD...: retry CMD until it succeeds or WAIT_SECS pass.
wait_for() {
  local name="$1" logf="$2"; shift 2
  local deadline=$((SECONDS + WAIT_SECS))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "last lines of $logf:"; tail -n 30 "$logf" >&2 2>/dev/null || true
      die "$name did not answer within ${WAIT_SECS}s"
    fi
    sleep 0.5
  done
}

kill_wait() {
  local pid="$1" i
  kill "$pid" 2>/dev/null || return 0
  for i in $(seq 1 50); do pid_alive "$pid" || return 0; sleep 0.2; done
  log "pid $pid ignored SIGTERM, sending SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
}

# ---------------------------------------------------------------- main ----

cmd_start() {
  mkdir -p "$STATE"
  ensure_tools
  # Servers still running from an older venv would keep it busy; moto is
  # stopped before the venv may be rebuilt (start_moto restarts it).
  [[ -f "$VENV_MARKER" ]] || stop_moto
  ensure_venv
  ensure_azurite
  start_moto
  start_azurite
  start_postgres
  start_etcd
  env_lines >"$ENV_FILE"
  # Chorus relies on S3 conditional writes; fail now if the fake S3 does not
  # enforce them rather than letting tests pass vacuously.
  log "checking moto's S3 semantics (conditional PUTs, ranges, listing)"
  "$VENV/bin/python" "$ROOT/scripts/check_moto_conditions.py" \
    --endpoints "$(endpoints)" --buckets "$(buckets)" ||
    die "moto does not behave as Chorus needs (see above)"
  log "all services up; env in $ENV_FILE"
}

cmd_stop() {
  stop_moto
  stop_azurite
  stop_postgres
  stop_etcd
  rm -f "$ENV_FILE"
  log "all services stopped"
}

cmd_status() {
  local i rc=0 pid
  for i in "${!ZONES[@]}"; do
    pid="$(cat "$STATE/moto-${ZONES[$i]}.pid" 2>/dev/null || true)"
    if pid_alive "$pid" && port_open "$MOTO_HOST" "${MOTO_PORTS[$i]}"; then
      echo "moto zone ${ZONES[$i]}: running (pid $pid, port ${MOTO_PORTS[$i]})"
    else
      echo "moto zone ${ZONES[$i]}: down"; rc=1
    fi
  done
  pid="$(cat "$STATE/azurite.pid" 2>/dev/null || true)"
  if pid_alive "$pid" && port_open "$AZURITE_HOST" "$AZURITE_PORT"; then
    echo "azurite: running (pid $pid, port $AZURITE_PORT)"
  else
    echo "azurite: down"; rc=1
  fi
  if port_open 127.0.0.1 "$PG_PORT" && [[ -f "$PG_DATA/postmaster.pid" ]]; then
    echo "postgres: running (port $PG_PORT, data $PG_DATA)"
  else
    echo "postgres: down"; rc=1
  fi
  pid="$(cat "$STATE/etcd.pid" 2>/dev/null || true)"
  if pid_alive "$pid" && etcdctl_here endpoint health >/dev/null 2>&1; then
    echo "etcd: running (pid $pid, $(etcd_endpoint), data $ETCD_DATA)"
  else
    echo "etcd: down"; rc=1
  fi
  return "$rc"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  env) env_lines ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|env|status" >&2; exit 2 ;;
esac
