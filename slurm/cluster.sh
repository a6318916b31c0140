#!/bin/bash
# A throw-away single-node Slurm cluster for tests, on Debian/Ubuntu without systemd.
#
#   slurm/cluster.sh install           install slurm-wlm + munge (and libpmix) if missing, only
#   slurm/cluster.sh up [STATE_DIR]    install them if missing, write slurm.conf,
#                                      start munged (unless one already answers), slurmctld, slurmd
#   slurm/cluster.sh down              cancel jobs, stop the daemons this script started,
#                                      restore (or remove) the slurm.conf it wrote
#   slurm/cluster.sh status            daemons and sinfo; exit 0 if up, 3 if not
#   slurm/cluster.sh logs              the tail of each daemon's log
#
# Needs root. Both up and down are idempotent. STATE_DIR (default $CCL_SLURM_STATE or
# /tmp/ccl-slurm) holds spool, state, pid and log files; slurmd executes batch scripts from
# its spool, so it must not be on a noexec mount. Installed packages are left installed.
# Environment: CCL_SLURM_CPUS (CPUs the node advertises; default max(nproc, 8) so that
# 4-task tests fit on small CI runners), CCL_SLURM_GPUS (fake GPUs it advertises, default 4,
# so that the GPU template's --gpus-per-node is scheduled and CUDA_VISIBLE_DEVICES set: they
# are /dev/null-like device nodes in STATE_DIR; 0 where mknod is not allowed),
# SLURM_CONF_DIR (default /etc/slurm, or /etc/slurm-llnl where only that exists).
set -euo pipefail

MARK="# written by ccl slurm/cluster.sh"
PARTITION=debug
if [[ -z "${SLURM_CONF_DIR:-}" ]]; then
  SLURM_CONF_DIR=/etc/slurm
  [[ ! -d /etc/slurm && -d /etc/slurm-llnl ]] && SLURM_CONF_DIR=/etc/slurm-llnl
fi
CONF=$SLURM_CONF_DIR/slurm.conf
GRES=$SLURM_CONF_DIR/gres.conf

say() { echo "cluster.sh: $*"; }
die() { echo "cluster.sh: error: $*" >&2; exit 1; }

# The state dir recorded in a slurm.conf this script wrote (empty if it did not write it).
our_state_dir() {
  [[ -f $CONF ]] && sed -n "s|^$MARK; state dir: ||p" "$CONF" | head -n1 || true
}

# pid from a pid file if that process is alive and is the named program, else nothing.
live_pid() {
  local file=$1 name=$2 pid
  [[ -s $file ]] || return 0
  pid=$(tr -dc '0-9' <"$file")
  [[ -n $pid && -r /proc/$pid/comm && $(cat "/proc/$pid/comm") == "$name" ]] && echo "$pid"
  return 0
}

# Wait up to $1 seconds for the command in the remaining arguments to succeed.
wait_for() {
  local seconds=$1; shift
  local i
  for ((i = 0; i < seconds * 4; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  return 1
}

stop_pid() {
  local pid=$1 i
  kill "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 40; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.25
  done
  kill -9 "$pid" 2>/dev/null || true
}

install_packages() {
  local need=()
  for prog in slurmctld slurmd srun sbatch munged; do
    command -v "$prog" >/dev/null || { need=(slurm-wlm munge); break; }
  done
  # srun --mpi=pmix (Open MPI) dlopens libpmix.so, which only the -dev package links
  dpkg -s libpmix-dev >/dev/null 2>&1 || need+=(libpmix2 libpmix-dev)
  [[ ${#need[@]} -eq 0 ]] && return 0
  command -v apt-get >/dev/null || die "install ${need[*]} (no apt-get here)"
  say "installing ${need[*]}"
  # Package scripts must not try to start services (there is no init system to do it).
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; made_policy=1
  fi
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends)
  local rc=0
  "${apt[@]}" "${need[@]}" >/dev/null || { apt-get update -qq && "${apt[@]}" "${need[@]}" >/dev/null; } || rc=$?
  [[ $made_policy == 1 ]] && rm -f "$policy"
  [[ $rc == 0 ]] || die "apt-get install ${need[*]} failed"
}

# Keep a copy of a configuration file this script is about to replace (once).
back_up() {
  local file=$1
  if [[ -f $file && ! -f $file.ccl-backup ]]; then
    cp -p "$file" "$file.ccl-backup"
    say "backed up $file to $file.ccl-backup"
  fi
}

# Put back what back_up saved, or remove the file this script wrote.
restore() {
  local file=$1
  if [[ -f $file.ccl-backup ]]; then
    mv -f "$file.ccl-backup" "$file"
    say "restored the previous $file"
  else
    rm -f "$file"
  fi
}

write_conf() {
  local state=$1 host cpus gpus first_job mem addr=""
  host=$(hostname -s)
  cpus=${CCL_SLURM_CPUS:-$(( $(nproc) > 8 ? $(nproc) : 8 ))}
  gpus=${CCL_SLURM_GPUS:-4}
  first_job=$(( $(date +%s) % 60000000 + 1 ))
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1)
  # a host name that does not resolve would stop slurmd from finding its controller
  getent hosts "$host" >/dev/null || addr="NodeAddr=127.0.0.1"
  mkdir -p "$SLURM_CONF_DIR"
  if [[ -z $(our_state_dir) ]]; then
    back_up "$CONF"
    back_up "$GRES"
  fi
  # slurmd accepts only character or block devices as GPU files: /dev/null's numbers will do
  local i gres_node=""
  for ((i = 0; i < gpus; i++)); do
    [[ -c $state/fakegpu$i ]] || mknod "$state/fakegpu$i" c 1 3 2>/dev/null ||
      { say "mknod not allowed here: no fake GPUs"; gpus=0; break; }
  done
  {
    echo "$MARK"
    if ((gpus > 0)); then
      echo "# fake GPUs for the GPU template's --gpus-per-node (task/none: nothing is bound)"
      echo "NodeName=$host Name=gpu File=$state/fakegpu[0-$((gpus - 1))]"
      gres_node="Gres=gpu:$gpus"
    fi
  } >"$GRES"
  cat >"$CONF" <<EOF
$MARK; state dir: $state
# Single-node test cluster; restored or removed by 'slurm/cluster.sh down'.
ClusterName=ccl-ci
SlurmctldHost=$host${addr:+(127.0.0.1)}
SlurmUser=root
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# advertise CCL_SLURM_CPUS CPUs even where the machine has fewer (tests oversubscribe)
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
# sbatch --wait polls every min(32, MinJobAge/2) s, growing x4 from 2 s: keep it at 2 s
MinJobAge=4
# Job ids must not repeat across restarts: MPICH names its shared-memory segment after the
# PMI job id (jobid.stepid), and reuses one that an aborted step of an earlier cluster left.
FirstJobId=$first_job
SlurmdSpoolDir=$state/slurmd
StateSaveLocation=$state/state
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
NodeName=$host $addr CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=${mem:-1024} $gres_node State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  local state=$1
  if munge_works; then
    say "munged already running; using it"
    return 0
  fi
  local key=/etc/munge/munge.key
  if [[ ! -s $key ]]; then
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then mungekey --create --keyfile="$key"
    else dd if=/dev/urandom of="$key" bs=1024 count=1 status=none; fi
    chown munge:munge "$key"; chmod 400 "$key"
  fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  runuser -u munge -- "$(command -v munged)"
  wait_for 10 munge_works || die "munged did not start (see /var/log/munge/munged.log)"
  # remembered so that 'down' stops only the munged it started
  cp /run/munge/munged.pid "$state/munged.pid"
}

node_ready() {
  local state
  state=$(sinfo -h -N -o %t 2>/dev/null | head -n1)
  [[ $state == idle || $state == mix || $state == alloc ]]
}

up() {
  [[ $(id -u) == 0 ]] || die "needs root (it installs packages, writes $CONF and starts daemons)"
  local state=${1:-${CCL_SLURM_STATE:-/tmp/ccl-slurm}}
  local current
  current=$(our_state_dir)
  if [[ -n $current ]] && [[ -n $(live_pid "$current/slurmctld.pid" slurmctld) ]] &&
     [[ -n $(live_pid "$current/slurmd.pid" slurmd) ]]; then
    say "already up (state dir $current)"
    sinfo
    return 0
  fi
  [[ -n $current ]] && state=$current  # restart a half-running cluster in place
  install_packages
  mkdir -p "$state/slurmd" "$state/state"
  state=$(cd "$state" && pwd -P)
  touch "$state/.ccl-cluster"
  if findmnt -n -o OPTIONS --target "$state" 2>/dev/null | tr ',' '\n' | grep -qx noexec; then
    die "$state is on a noexec mount; slurmd runs batch scripts from there: pass another dir"
  fi
  write_conf "$state"
  start_munge "$state"
  [[ -n $(live_pid "$state/slurmctld.pid" slurmctld) ]] || slurmctld -i
  wait_for 20 scontrol ping || die "slurmctld did not answer; see: $0 logs"
  [[ -n $(live_pid "$state/slurmd.pid" slurmd) ]] || slurmd
  if ! wait_for 20 node_ready; then
    # e.g. left DOWN by an earlier run's state
    scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true
    wait_for 10 node_ready || die "node not idle: $(sinfo -h -N -o '%t %E'); see: $0 logs"
  fi
  say "up (state dir $state)"
  sinfo
}

down() {
  local state
  state=$(our_state_dir)
  if [[ -z $state ]]; then
    say "not up (no slurm.conf written by this script); nothing to do"
    return 0
  fi
  local ctld slurmd_pid
  ctld=$(live_pid "$state/slurmctld.pid" slurmctld)
  slurmd_pid=$(live_pid "$state/slurmd.pid" slurmd)
  if [[ -n $ctld ]]; then
    # end running jobs first: their slurmstepd processes outlive slurmd otherwise
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      say "cancelling jobs: $(echo $jobs)"
      scancel $jobs 2>/dev/null || true
      wait_for 15 bash -c '[[ -z $(squeue -h -o %i) ]]' || say "warning: jobs still listed"
    fi
  fi
  [[ -n $slurmd_pid ]] && stop_pid "$slurmd_pid"
  [[ -n $ctld ]] && stop_pid "$ctld"
  local munged
  munged=$(live_pid "$state/munged.pid" munged)
  [[ -n $munged ]] && stop_pid "$munged"
  restore "$GRES"
  restore "$CONF"
  # only a directory this script created (it holds the marker file) is removed
  if [[ -f $state/.ccl-cluster ]]; then
    rm -rf "$state"
  fi
  say "down"
}

status() {
  local state ctld slurmd_pid
  state=$(our_state_dir)
  if [[ -z $state ]]; then
    say "down (no slurm.conf written by this script at $CONF)"
    return 3
  fi
  ctld=$(live_pid "$state/slurmctld.pid" slurmctld)
  slurmd_pid=$(live_pid "$state/slurmd.pid" slurmd)
  say "state dir $state; slurmctld pid ${ctld:-none}; slurmd pid ${slurmd_pid:-none}; " \
      "munge $(munge_works && echo ok || echo 'not answering')"
  if [[ -n $ctld && -n $slurmd_pid ]]; then
    sinfo
    return 0
  fi
  return 3
}

logs() {
  local state
  state=$(our_state_dir)
  [[ -n $state ]] || { say "no cluster written by this script"; return 0; }
  for f in "$state"/*.log; do
    [[ -f $f ]] || continue
    echo "== $f"; tail -n "${LINES_PER_LOG:-40}" "$f"
  done
}

case ${1:-} in
  install) [[ $(id -u) == 0 ]] || die "needs root (apt-get)"; install_packages ;;
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  logs) logs ;;
  *) echo "usage: $0 install | up [STATE_DIR] | down | status | logs" >&2; exit 2 ;;
esac
