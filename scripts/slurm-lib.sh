# shellcheck shell=bash disable=SC2034  # the variables are the scripts' to use
# Shared helpers of scripts/slurm-up.sh and scripts/slurm-down.sh (sourced, not run).
#
# A test cluster is a "topology" (single, two-node or multi) with its own state directory
# ${FIBERRL_SLURM_DIR:-/var/tmp/fiberrl-slurm}/<topology> holding
#   slurm.conf                         the cluster's configuration (clients: SLURM_CONF)
#   slurmctld.pid, slurmd-<node>.pid   the daemons' PID files
#   slurmctld.log, slurmd-<node>.log   their logs
#   ctld/, spool/<node>/               StateSaveLocation, SlurmdSpoolDir
# Several topologies can be up at once: they differ in ClusterName, ports and state
# directory and share one munged.

# Slurm's daemons and iproute2 live in sbin, which a non-login root shell may lack.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

FIBERRL_SLURM_BASE=${FIBERRL_SLURM_DIR:-/var/tmp/fiberrl-slurm}
# munged's PID, present only while a munged started by slurm-up.sh runs; shared by all
# topologies, so the last slurm-down.sh stops it.
MUNGE_MARK="$FIBERRL_SLURM_BASE/munged.pid"
# slurmd and therefore every slurmstepd it forks carry this in their environment, so
# slurm-down.sh can find step daemons left behind by a killed slurmd.
MARKER_VAR=FIBERRL_SLURM_STATE

# The namespaced topologies' networks: a bridge in the root namespace and one namespace
# per node. two-node and multi have their own bridges and subnets, so either can be
# brought up or down without disturbing the other.
BRIDGE=fbrl-br0
BRIDGE_ADDR=10.213.0.1

log() { echo "slurm-${TOPO:-?}: $*" >&2; }
die() { log "error: $*"; exit 1; }

# select_topology NAME [NODES [CPUS]]: sets the topology's parameters (TOPO, STATE, CONF,
# CLUSTER, ports, the controller's address, the nodes and their addresses and sizes, and
# NAMESPACED=1 when each node runs in its own network and UTS namespace).
select_topology() {
    TOPO=${1:-single}
    HOST=$(hostname -s)
    NAMESPACED=0
    case "$TOPO" in
        single)
            CLUSTER=fiberrl-single
            CTLD_PORT=6817
            SLURMD_PORT=6818
            CTLD_ADDR=127.0.0.1
            NODES=("$HOST")
            NODE_ADDRS=(127.0.0.1)
            NODE_CPUS=16
            NODE_MEM=16384
            ;;
        two-node)
            CLUSTER=fiberrl-two
            CTLD_PORT=6827
            SLURMD_PORT=6828
            CTLD_ADDR=$BRIDGE_ADDR
            NODES=(fbrl-n1 fbrl-n2)
            NODE_ADDRS=(10.213.0.11 10.213.0.12)
            NODE_CPUS=8
            NODE_MEM=8192
            NAMESPACED=1
            ;;
        multi)
            # N nodes (default 16, at most 200), each offering CPUS CPUs (default 64): a
            # pool worker asks for one CPU, so CPUS caps the workers per node.
            local count=${2:-${FIBERRL_SLURM_NODES:-16}} i
            NODE_CPUS=${3:-${FIBERRL_SLURM_NODE_CPUS:-64}}
            [[ $count =~ ^[0-9]+$ ]] && [ "$count" -ge 1 ] && [ "$count" -le 200 ] ||
                { echo "multi: NODES must be 1..200, got $count" >&2; exit 2; }
            [[ $NODE_CPUS =~ ^[0-9]+$ ]] && [ "$NODE_CPUS" -ge 1 ] ||
                { echo "multi: CPUS must be a positive integer, got $NODE_CPUS" >&2; exit 2; }
            CLUSTER=fiberrl-multi
            CTLD_PORT=6837
            SLURMD_PORT=6838
            BRIDGE=fbrl-br1
            BRIDGE_ADDR=10.214.0.1
            CTLD_ADDR=$BRIDGE_ADDR
            NODES=()
            NODE_ADDRS=()
            for ((i = 1; i <= count; i++)); do
                NODES+=("fbrl-m$i")
                NODE_ADDRS+=("10.214.0.$((10 + i))")
            done
            NODE_MEM=$((NODE_CPUS * 256))  # DefMemPerCPU=256: every CPU can be allocated
            NAMESPACED=1
            ;;
        *)
            echo "usage: $0 [single|two-node|multi [NODES [CPUS_PER_NODE]]]" >&2
            exit 2
            ;;
    esac
    STATE="$FIBERRL_SLURM_BASE/$TOPO"
    CONF="$STATE/slurm.conf"
    CTLD_PID="$STATE/slurmctld.pid"
    export SLURM_CONF="$CONF"
}

# slurmd_pidfile NODE: where that node's slurmd writes its PID (SlurmdPidFile with %n).
slurmd_pidfile() { echo "$STATE/slurmd-$1.pid"; }

# lock: serialise slurm-up/slurm-down runs (of any topology) on fd 9. Every daemon is
# started with fd 9 closed, or it would hold the lock for ever.
lock() {
    mkdir -p "$FIBERRL_SLURM_BASE"
    chmod 755 "$FIBERRL_SLURM_BASE"
    exec 9>"$FIBERRL_SLURM_BASE/.lock"
    flock -w 300 9 || die "another slurm-up/slurm-down is still running"
}

# live_pid FILE NAME: print the PID in FILE if that process is alive and named NAME
# (so a stale file whose PID was reused is not mistaken for the daemon).
live_pid() {
    local file=$1 name=$2 pid
    [ -s "$file" ] || return 1
    pid=$(tr -dc 0-9 <"$file")
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 1
    exited "$pid" && return 1
    echo "$pid"
}

# exited PID: true if PID is gone or has exited (a zombie not reaped yet).
exited() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    [ "${stat:0:1}" = Z ]
}

# wait_gone SECONDS PID...: wait until none of the PIDs exists; fails on timeout.
wait_gone() {
    local deadline=$((SECONDS + $1)) pid alive
    shift
    while :; do
        alive=0
        for pid in "$@"; do
            exited "$pid" || alive=1
        done
        [ "$alive" = 0 ] && return 0
        [ "$SECONDS" -ge "$deadline" ] && return 1
        sleep 0.1
    done
}

# stop_pidfile FILE NAME: SIGTERM the daemon in FILE, SIGKILL it if still there after 15 s,
# wait until it is gone and remove FILE.
stop_pidfile() {
    local file=$1 name=$2 pid
    if pid=$(live_pid "$file" "$name"); then
        log "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_gone 15 "$pid"; then
            log "$name (pid $pid) ignored SIGTERM; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone 10 "$pid" || die "$name (pid $pid) does not die"
        fi
    fi
    rm -f "$file"
}

# descendants PID...: print the PIDs of every descendant of the given processes.
descendants() {
    local -A kids=()
    local stat rest p ppid
    for p in /proc/[0-9]*; do
        stat=$(cat "$p/stat" 2>/dev/null) || continue
        rest=${stat##*) }          # fields after "pid (comm) "
        read -r _ ppid _ <<<"$rest"
        kids[$ppid]+=" ${p#/proc/}"
    done
    local queue=("$@") out=()
    while [ ${#queue[@]} -gt 0 ]; do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        for ppid in ${kids[$p]:-}; do
            out+=("$ppid")
            queue+=("$ppid")
        done
    done
    echo "${out[@]:-}"
}

# kill_trees PID...: SIGKILL the processes and all their descendants and wait for them.
kill_trees() {
    [ $# -gt 0 ] || return 0
    local all
    # shellcheck disable=SC2207
    all=($(descendants "$@") "$@")
    kill -KILL "${all[@]}" 2>/dev/null || true
    wait_gone 10 "${all[@]}" || log "warning: some processes survived SIGKILL: ${all[*]}"
}

# ancestors PID: PID and the PIDs of all its ancestors.
ancestors() {
    local pid=$1 stat
    while [ -n "$pid" ] && [ "$pid" != 0 ]; do
        echo "$pid"
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 0
        stat=${stat##*) }
        read -r _ pid _ <<<"$stat"
    done
}

# cluster_pids: the processes this topology's slurmd(s) left: step daemons (they carry
# $MARKER_VAR=$STATE) and job processes (slurmstepd puts SLURM_CLUSTER_NAME in every
# job's environment), also those that escaped their step: proctrack/linuxproc loses a
# process whose parent died (it is reparented to init), and Slurm never kills it. This
# script and its ancestors are spared (it could run inside a job of this cluster).
cluster_pids() {
    local p pid spared
    spared=" $(ancestors $$ | tr '\n' ' ') $BASHPID "
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [[ $spared == *" $pid "* ]] && continue
        if tr '\0' '\n' 2>/dev/null <"$p/environ" |
            grep -qFx -e "$MARKER_VAR=$STATE" -e "SLURM_CLUSTER_NAME=$CLUSTER"; then
            echo "$pid"
        fi
    done
}

# other_topologies_up: true if a slurmctld of another topology under the base dir runs.
other_topologies_up() {
    local f
    for f in "$FIBERRL_SLURM_BASE"/*/slurmctld.pid; do
        [ -e "$f" ] && [ "$f" != "$CTLD_PID" ] || continue
        live_pid "$f" slurmctld >/dev/null && return 0
    done
    return 1
}

# print_logs: the tails of this topology's daemon logs (on failure).
print_logs() {
    local f
    for f in "$STATE"/*.log /var/log/munge/munged.log; do
        [ -e "$f" ] || continue
        echo "----- tail of $f" >&2
        tail -n 25 "$f" >&2
    done
}
