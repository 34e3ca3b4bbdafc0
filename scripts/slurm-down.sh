#!/usr/bin/env bash
# Tear down a test cluster brought up by scripts/slurm-up.sh:
#
#   bash scripts/slurm-down.sh [single|two-node|multi [NODES]]    # default: single
#
# Cancels the cluster's jobs, stops its slurmd(s) and slurmctld by PID file, kills any
# step daemon or job process they left behind, removes a namespaced topology's network (namespaces,
# veths, bridge) and stops munged if slurm-up.sh started it and no other topology still
# runs. Waits until every such process is gone. Nothing up: nothing to do, exit 0.
# Job state (StateSaveLocation) and logs stay in the state directory.
set -euo pipefail
# shellcheck source=scripts/slurm-lib.sh
source "$(dirname "$0")/slurm-lib.sh"

# cancel_jobs: while the controller runs, cancel every job (so their processes get
# SIGTERM, then SIGKILL after KillWait) and wait up to 10 s for them to end.
cancel_jobs() {
    live_pid "$CTLD_PID" slurmctld >/dev/null || return 0
    local jobs
    jobs=$(squeue -h -o %i -t PD,CF,R,S,CG 2>/dev/null) || return 0
    [ -n "$jobs" ] || return 0
    log "cancelling $(wc -w <<<"$jobs") job(s)"
    scancel --partition=debug >&2 || true
    local deadline=$((SECONDS + 10))
    while [ "$SECONDS" -lt "$deadline" ]; do
        jobs=$(squeue -h -o %i -t CF,R,S,CG 2>/dev/null) || return 0
        [ -n "$jobs" ] || return 0
        sleep 0.2
    done
    log "jobs still ending after 10 s: ${jobs//$'\n'/ }; killing their processes"
}

# stop_slurmds: stop every slurmd of this topology, then kill whatever step daemon or job
# process is left (see cluster_pids) and, for two-node, every process in the nodes'
# network namespaces.
stop_slurmds() {
    local node pids
    for node in "${NODES[@]}"; do
        stop_pidfile "$(slurmd_pidfile "$node")" slurmd
    done
    pids=$(cluster_pids)
    if [ -n "$pids" ]; then
        log "killing leftover step daemons and job processes: ${pids//$'\n'/ }"
        # shellcheck disable=SC2086
        kill_trees $pids
    fi
    if [ "$NAMESPACED" = 1 ]; then
        for node in "${NODES[@]}"; do
            [ -e "/run/netns/$node" ] || continue
            pids=$(ip netns pids "$node" 2>/dev/null || true)
            if [ -n "$pids" ]; then
                log "killing processes left in namespace $node: ${pids//$'\n'/ }"
                # shellcheck disable=SC2086
                kill_trees $pids
            fi
        done
    fi
}

# remove_network: the namespaces (deleting one deletes its veth pair), the bridge and
# the namespaces' hosts files.
remove_network() {
    local node
    for node in "${NODES[@]}"; do
        if [ -e "/run/netns/$node" ]; then
            log "removing network namespace $node"
            ip netns del "$node"
        fi
        ip link del "$node-v" 2>/dev/null || true
        rm -rf "/etc/netns/$node"
    done
    rmdir /etc/netns 2>/dev/null || true
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        log "removing bridge $BRIDGE"
        ip link del "$BRIDGE"
    fi
}

# stop_munged: stop munged if one of our slurm-up runs started it and no other topology
# still needs it.
stop_munged() {
    live_pid "$MUNGE_MARK" munged >/dev/null || { rm -f "$MUNGE_MARK"; return 0; }
    if other_topologies_up; then
        log "leaving munged running for the other topology"
        return 0
    fi
    stop_pidfile "$MUNGE_MARK" munged
}

main() {
    select_topology "${1:-single}" "${@:2}"
    if [ "$TOPO" = multi ] && [ -z "${2:-}" ] && [ -f "$CONF" ]; then
        # the nodes it was brought up with, whatever NODES says now
        mapfile -t NODES < <(sed -n 's/^NodeName=\([^ ]*\) .*/\1/p' "$CONF")
    fi
    [ "$(id -u)" = 0 ] || die "must run as root"
    # Were this run inside a job, its own children would look like the cluster's.
    unset "$MARKER_VAR" SLURM_CLUSTER_NAME
    lock
    cancel_jobs
    stop_slurmds
    stop_pidfile "$CTLD_PID" slurmctld
    if [ "$NAMESPACED" = 1 ]; then remove_network; fi
    stop_munged
    rm -f "$STATE"/*.pid
    log "down"
}

main "$@"
