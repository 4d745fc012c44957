#!/usr/bin/env bash
# A single-node Ceph cluster for tests and benchmarks, from Debian's packages
# (ceph-mon, ceph-mgr, ceph-osd, ceph-common):
#
#   scripts/ceph-cluster.sh start DIR   monitor, manager and three OSDs (BlueStore
#                                       on sparse files) under DIR; writes
#                                       DIR/ceph.conf and DIR/ceph.client.admin.keyring
#                                       and a pool `rbd` (size 2, min_size 1)
#   scripts/ceph-cluster.sh stop DIR    stops every daemon of that cluster
#   scripts/ceph-cluster.sh stop-osd DIR ID / start-osd DIR ID
#
# Every daemon listens on 127.0.0.1 only. Clients use the cluster with
# `-c DIR/ceph.conf` (the keyring path is in it), e.g. `rbd -c DIR/ceph.conf ls`.
# Environment: CEPH_OSD_SIZE (each OSD's file, default 4G, sparse),
# CEPH_MON_PORT (default: a free port), CEPH_MIN_FREE_MIB (free space DIR's
# filesystem must have at start, default 512).
set -euo pipefail

usage() {
  echo "usage: $0 start DIR | stop DIR | stop-osd DIR ID | start-osd DIR ID" >&2
  exit 2
}

[ $# -ge 2 ] || usage
command="$1"
dir="$(realpath -m "$2")"
conf="$dir/ceph.conf"
osd_count=3

ceph_cli() { timeout 60 ceph -c "$conf" "$@"; }

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# A daemon that refuses to start says why only in its log: show the errors.
report_daemon_errors() {
  [ -d "$dir/log" ] || return 0
  local errors
  errors="$(grep -h -- ' -1 ' "$dir"/log/*.log 2>/dev/null | tail -n 5 || true)"
  [ -z "$errors" ] || printf 'ceph-cluster: the daemons logged:\n%s\n' "$errors" >&2
}

# Wait up to $1 seconds for a command to succeed.
wait_for() {
  local seconds="$1"
  shift
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "ceph-cluster: timed out after ${seconds}s waiting for: $*" >&2
      return 1
    fi
    sleep 0.5
  done
}

osds_up() {
  local up
  up="$(ceph_cli osd stat -f json | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["num_up_osds"])')"
  [ "$up" -ge "$1" ]
}

pgs_clean() {
  ceph_cli pg stat -f json | /usr/bin/python3 -c '
import json, sys
stat = json.load(sys.stdin)
summary = stat.get("pg_summary", stat)
states = summary.get("num_pg_by_state", [])
total = summary.get("num_pgs", 0)
clean = sum(s["num"] for s in states if s["name"] == "active+clean")
sys.exit(0 if total > 0 and clean == total else 1)'
}

start_osd() {
  local id="$1"
  ceph-osd -c "$conf" -i "$id" 2>>"$dir/log/osd.$id.stderr"
}

stop_osd() {
  local id="$1" pid_file="$dir/run/osd.$1.pid"
  [ -f "$pid_file" ] || { echo "ceph-cluster: osd.$id has no pid file" >&2; return 1; }
  local pid
  pid="$(cat "$pid_file")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

start() {
  if [ -e "$conf" ]; then
    echo "ceph-cluster: $conf exists; stop and remove that cluster first" >&2
    exit 1
  fi
  for tool in ceph ceph-mon ceph-mgr ceph-osd ceph-authtool monmaptool; do
    command -v "$tool" >/dev/null || {
      echo "ceph-cluster: $tool not found; install ceph-mon ceph-mgr ceph-osd ceph-common" >&2
      exit 1
    }
  done
  mkdir -p "$dir"/{run,log,mon,mgr,osd}
  local free_mib min_free_mib="${CEPH_MIN_FREE_MIB:-512}"
  free_mib="$(df -P -m "$dir" | awk 'NR == 2 { print $4 }')"
  if [ "$free_mib" -lt "$min_free_mib" ]; then
    echo "ceph-cluster: $dir has ${free_mib} MiB free; the cluster needs ${min_free_mib} MiB" >&2
    exit 1
  fi
  trap 'status=$?; [ "$status" -eq 0 ] || report_daemon_errors' EXIT
  local fsid port
  fsid="$(cat /proc/sys/kernel/random/uuid)"
  port="${CEPH_MON_PORT:-$(free_port)}"
  cat > "$conf" <<EOF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$port
public addr = 127.0.0.1
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
run dir = $dir/run
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
crash dir = $dir/crash
ms bind msgr2 = false
# One host: replicas go to different OSDs, not different hosts.
osd crush chooseleaf type = 0
osd pool default size = 2
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool delete = true
mon warn on pool no redundancy = false
# A stopped OSD stays in: it catches up by recovery when it returns.
mon osd down out interval = 0
mon warn on osd down out interval zero = false
auth allow insecure global id reclaim = false
# Small daemons: this cluster shares the machine with its clients.
# Free space is checked in MiB at start; a percentage of a large shared disk
# means nothing here, so the monitor never refuses to start or stops for it.
mon data avail warn = 1
mon data avail crit = -1

[client]
keyring = $dir/ceph.client.admin.keyring
# Clients run many at a time; only the daemons keep an admin socket.
admin socket =

[mon]
mon data = $dir/mon/\$name

[mgr]
mgr data = $dir/mgr/\$name
mgr initial modules = 

[osd]
osd data = $dir/osd/\$name
osd objectstore = bluestore
bluestore block create = true
bluestore block size = ${CEPH_OSD_SIZE:-4G}
bluestore fsck on mount = false
osd memory target = 939524096
bluestore cache autotune = false
bluestore cache size = 134217728
osd op num shards = 1
# An OSD that dies without a word is marked down in seconds, not 20 s.
osd heartbeat interval = 2
osd heartbeat grace = 8
osd op num threads per shard = 2
EOF

  ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$dir/ceph.client.admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/ceph.client.admin.keyring" >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v1:127.0.0.1:$port]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring"
  ceph-mon -c "$conf" -i a
  wait_for 30 ceph_cli mon stat

  mkdir -p "$dir/mgr/mgr.x"
  ceph_cli auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
    > "$dir/mgr/mgr.x/keyring"
  ceph-mgr -c "$conf" -i x

  # The OSDs' mkfs run side by side: each writes its BlueStore.
  local pids=()
  for _ in $(seq 1 $osd_count); do
    local uuid secret id
    uuid="$(cat /proc/sys/kernel/random/uuid)"
    secret="$(ceph-authtool --gen-print-key)"
    id="$(echo "{\"cephx_secret\": \"$secret\"}" | ceph_cli osd new "$uuid" -i -)"
    mkdir -p "$dir/osd/osd.$id"
    ceph-authtool --create-keyring "$dir/osd/osd.$id/keyring" --name "osd.$id" --add-key "$secret" >/dev/null
    ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" > "$dir/log/osd.$id.mkfs.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || { echo "ceph-cluster: an OSD mkfs failed; see $dir/log" >&2; exit 1; }
  done
  for id in $(seq 0 $((osd_count - 1))); do
    start_osd "$id"
  done
  wait_for 90 osds_up "$osd_count"

  ceph_cli osd pool create rbd 32 32 >/dev/null 2>&1
  ceph_cli osd pool set rbd size 2 >/dev/null 2>&1
  ceph_cli osd pool set rbd min_size 1 >/dev/null 2>&1
  timeout 60 rbd -c "$conf" pool init rbd
  wait_for 90 pgs_clean
  echo "ceph-cluster: up in ${SECONDS}s; use -c $conf"
}

stop() {
  # Every daemon of this cluster and nothing else: they all run with -c CONF.
  local pattern="ceph-(mon|mgr|osd) -c $conf "
  pkill -f -- "$pattern" 2>/dev/null || true
  for _ in $(seq 1 100); do
    pgrep -f -- "$pattern" >/dev/null || return 0
    sleep 0.1
  done
  pkill -9 -f -- "$pattern" 2>/dev/null || true
  sleep 0.2
}

case "$command" in
  start) start ;;
  stop) stop ;;
  stop-osd) [ $# -eq 3 ] || usage; stop_osd "$3" ;;
  start-osd) [ $# -eq 3 ] || usage; start_osd "$3" ;;
  *) usage ;;
esac
