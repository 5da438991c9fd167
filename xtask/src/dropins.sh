#!/usr/bin/env bash
# Runs inside the Soft-RoCE VM (cargo xtask dropins): each API check program
# (xtask/src/peers/{nixl,mooncake}_api_check.py) as a target and an initiator process, once on
# the original package (the peers' venv, PEERS_VENV) and once on gdr's drop-in (the wheel's
# venv, PY). Each side's output is a section:
#   ### dropin api=API impl=IMPL side=SIDE
#   step ...
#   ### end rc=N
# Usage: dropins.sh DEVICE GID_INDEX
set -u
dev=$1 gid=$2
site=$(echo "$PEERS_VENV"/lib/python3*/site-packages)
# NIXL's wheel bundles a libibverbs that looks for providers in its own folder (see
# compare-peers.sh): preload it and point it at the system's providers; rc_verbs over rxe.
nixl_env=(env LD_PRELOAD="$(ls "$site"/nixl_cu12.libs/libibverbs-*.so* 2>/dev/null)"
    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/libibverbs
    UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES="$dev:1" UCX_IB_GID_INDEX="$gid" UCX_LOG_LEVEL=error)
gdr_env=(env UCX_NET_DEVICES="$dev:1" UCX_IB_GID_INDEX="$gid" MC_GID_INDEX="$gid")
mc_env=(env MC_GID_INDEX="$gid" MC_LOG_LEVEL=WARNING)
port=17100

# run_pair API IMPL PYTHON ENV...: both sides, then their sections.
run_pair() {
    local api=$1 impl=$2 py=$3
    shift 3
    local out=/tmp/dropin.$api.$impl prog="$PEERS_DIR/${api}_api_check.py"
    port=$((port + 1))
    "$@" "$py" "$prog" --impl "$impl" --mode target --port "$port" --device "$dev" >"$out.target" 2>"$out.target.err" &
    local tp=$!
    timeout 300 "$@" "$py" "$prog" --impl "$impl" --mode initiator --port "$port" --device "$dev" \
        >"$out.initiator" 2>"$out.initiator.err"
    local irc=$?
    # The target ends after the initiator's goodbye; one that hangs is killed.
    (sleep 60; kill -9 "$tp" 2>/dev/null) &
    local killer=$!
    wait "$tp"
    local trc=$?
    kill "$killer" 2>/dev/null
    for side in target initiator; do
        local rc=$trc
        [ "$side" = initiator ] && rc=$irc
        echo "### dropin api=$api impl=$impl side=$side"
        grep '^step ' "$out.$side"
        echo "### end rc=$rc"
        if [ "$rc" != 0 ]; then
            echo "--- $api $impl $side: stderr (last 30 lines)"
            tail -n 30 "$out.$side.err"
        fi
    done
}

run_pair nixl nixl "$PEERS_VENV/bin/python" "${nixl_env[@]}"
run_pair nixl gdr "$PY" "${gdr_env[@]}"
run_pair mooncake mooncake "$PEERS_VENV/bin/python" "${mc_env[@]}"
run_pair mooncake gdr "$PY" "${gdr_env[@]}"
