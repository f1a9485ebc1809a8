#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for launch tests (scripts/slurm/selftest.sh).
#
#   bash scripts/slurm/local-cluster.sh [start]   # start it, or check it is up (idempotent)
#   bash scripts/slurm/local-cluster.sh stop      # stop what start started
#   bash scripts/slurm/local-cluster.sh status    # exit 0 if it is up (node idle or busy)
#   bash scripts/slurm/local-cluster.sh env       # print the line that points the Slurm
#                                                 # commands (sinfo, sbatch, srun) at it
#
# Needs root and the Debian packages slurm-wlm and munge (scripts/install-deps.sh); no
# systemd: the daemons are started directly. Everything of the cluster lives in one
# directory, $HDP_SLURM_DIR (default /var/tmp/hdp-trainer-slurm): slurm.conf, state and
# spool directories, pid and log files. /etc/slurm is not touched, so the Slurm commands
# need SLURM_CONF=$HDP_SLURM_DIR/slurm.conf (`eval "$(bash local-cluster.sh env)"`).
# munged uses the packaged key /etc/munge/munge.key (created if missing).
#
# The node is `hostname -s` at 127.0.0.1 with CPUs = nproc, in partition "debug"
# (the default); the daemons run as root with proctrack/linuxproc and task/none (no
# cgroups), select/cons_tres, no accounting. Ports: $HDP_SLURM_CTLD_PORT (6817) and
# $HDP_SLURM_D_PORT (6818). start waits up to $HDP_SLURM_TIMEOUT seconds (30) for
# sinfo to show the node idle, else prints the daemon logs and exits 1.
set -euo pipefail

dir="${HDP_SLURM_DIR:-/var/tmp/hdp-trainer-slurm}"
ctld_port="${HDP_SLURM_CTLD_PORT:-6817}"
d_port="${HDP_SLURM_D_PORT:-6818}"
timeout="${HDP_SLURM_TIMEOUT:-30}"
conf="$dir/slurm.conf"
node="$(hostname -s)"
export SLURM_CONF="$conf"
export PATH="$PATH:/usr/sbin"

say() { echo "local-cluster: $*"; }
die() { echo "local-cluster: error: $*" >&2; exit 1; }

# True if the pid file names a live process of that program (not a recycled pid).
alive() {
  local pid
  [ -s "$1" ] || return 1
  pid="$(cat "$1")"
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$(basename "$1" .pid)" ]
}

# Sends TERM to the processes of the given pid files (NAME=PIDFILE ...) at once and
# waits up to 10 s for them to exit (then KILL).
stop_pids() {
  local arg name pidfile pid i left
  local -a names=() pids=()
  for arg in "$@"; do
    name="${arg%%=*}" pidfile="${arg#*=}"
    if alive "$pidfile"; then
      pid="$(cat "$pidfile")"
      kill "$pid" 2>/dev/null || true
      names+=("$name") pids+=("$pid")
    fi
    rm -f "$pidfile"
  done
  for i in $(seq 100); do
    left=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [ "$left" -eq 0 ] && break
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then kill -9 "${pids[$i]}" 2>/dev/null || true; fi
    say "stopped ${names[$i]} (pid ${pids[$i]})"
  done
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

node_state() { sinfo -h -n "$node" -o %t 2>/dev/null | head -n1; }

write_conf() {
  local cpus tmp
  cpus="$(nproc)"
  tmp="$(mktemp "$dir/slurm.conf.XXXXXX")"
  cat > "$tmp" <<EOF
# Written by scripts/slurm/local-cluster.sh: a one-node test cluster. Do not edit.
ClusterName=hdp-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=60
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=5
KillWait=5
Waittime=0
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  chmod 0644 "$tmp"     # the Slurm commands of other users read it too
  if [ -f "$conf" ] && cmp -s "$tmp" "$conf"; then
    rm -f "$tmp"
    return 1            # unchanged
  fi
  mv "$tmp" "$conf"
  return 0
}

start_munge() {
  if munge_ok; then return; fi
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating /etc/munge/munge.key"
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge
  install -d -o munge -g munge -m 0711 /var/lib/munge
  # Run as the munge user, as the packaged service does.
  runuser -u munge -- /usr/sbin/munged
  touch "$dir/munged.ours"      # stop only stops a munged that start started
  local i
  for i in $(seq 50); do munge_ok && break; sleep 0.1; done
  munge_ok || die "munged does not answer (see /var/log/munge/munged.log)"
  say "started munged"
}

# Fails if something already listens on the port (another Slurm on this machine):
# sinfo would answer from it.
port_free() {   # port, the variable that sets it
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    die "port $1 is in use by another program (another Slurm?); choose another with $2=PORT"
  fi
}

show_logs() {
  local f
  for f in "$dir/log/slurmctld.log" "$dir/log/slurmd.log"; do
    if [ -f "$f" ]; then echo "--- last lines of $f" >&2; tail -n 20 "$f" >&2; fi
  done
}

start() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (it starts munged, slurmctld and slurmd)"
  local cmd
  for cmd in munged munge slurmctld slurmd sinfo scontrol; do
    command -v "$cmd" >/dev/null 2>&1 ||
      die "$cmd not found; install the Debian packages: slurm-wlm munge (scripts/install-deps.sh)"
  done
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"

  # A changed configuration (other core count, ports) restarts the daemons.
  if write_conf; then
    if alive "$dir/slurmd.pid" || alive "$dir/slurmctld.pid"; then
      say "slurm.conf changed; restarting the daemons"
      stop_pids slurmd="$dir/slurmd.pid" slurmctld="$dir/slurmctld.pid"
    fi
  fi

  start_munge

  if ! alive "$dir/slurmctld.pid"; then
    port_free "$ctld_port" HDP_SLURM_CTLD_PORT
    # -i: start even if the saved state is unreadable (a machine restarted mid-job).
    slurmctld -i -f "$conf"
    say "started slurmctld"
  fi
  if ! alive "$dir/slurmd.pid"; then
    port_free "$d_port" HDP_SLURM_D_PORT
    slurmd -f "$conf"
    say "started slurmd"
  fi

  local t0 state=""
  t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$timeout" ]; do
    # A daemon that exited (port in use, bad configuration) will not come back.
    if [ $((SECONDS - t0)) -ge 2 ] && ! { alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid"; }; then
      show_logs
      die "slurmctld or slurmd exited; logs in $dir/log"
    fi
    state="$(node_state)"
    case "$state" in
      idle|mix|alloc|comp) break ;;
      down*|drain*|fail*) scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
  done
  case "$state" in
    idle|mix|alloc|comp) alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid" ||
      { show_logs; die "slurmctld or slurmd exited; logs in $dir/log"; } ;;
    *) show_logs
       die "node $node not idle after ${timeout}s (sinfo state: '${state:-no answer}'); logs in $dir/log" ;;
  esac
  say "node $node is $state ($(nproc) CPUs, partition debug); SLURM_CONF=$conf"
}

stop() {
  stop_pids slurmd="$dir/slurmd.pid" slurmctld="$dir/slurmctld.pid"
  if [ -f "$dir/munged.ours" ]; then
    stop_pids munged=/run/munge/munged.pid
    rm -f "$dir/munged.ours"
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) munge_ok && alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid" &&
    case "$(node_state)" in idle|mix|alloc|comp) true ;; *) false ;; esac ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) echo "usage: $0 [start|stop|status|env]" >&2; exit 2 ;;
esac
