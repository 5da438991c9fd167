#!/usr/bin/env bash
# Runs one case of `cargo xtask compare-peers` on one RDMA device: gdr xfer-bench and the peers
# (Mooncake TE's Python batch API, Mooncake's C++ transfer_engine_bench, NIXL's Python API over
# UCX) with the same workload, target and initiator as two processes on this host, ROUNDS
# rounds with the tools' order rotating, and prints each run between markers the xtask parses:
#   ### TOOL round=R
#   (the initiator's output)
#   target: (the target's output)
#   ### pkts sent=N
#   ### end rc=A server_rc=B
# Every tool but Mooncake's C++ bench checks its data (both sides print a digest); the rxe
# packet counter shows that the traffic crossed the device (a silent TCP fallback sends none).
#
# usage: compare-peers.sh DEVICE GID_INDEX ROUNDS SECONDS OP SIZE BATCH QPS THREADS DEPTH TOOLS
#   TOOLS: comma-separated, of gdr, mooncake, mooncake-cpp, nixl.
# Environment: GDR (the gdr binary), PEERS_VENV (the peers' virtual environment), PEERS_DIR
# (the drivers' folder), PORT_BASE.
set -u
dev=$1 gid=$2 rounds=$3 secs=$4 op=$5 size=$6 batch=$7 qps=$8 threads=$9 depth=${10} tools=${11}
port=${PORT_BASE:-19720}
py="$PEERS_VENV/bin/python"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
need=$((size * batch * threads * depth))
counter=/sys/class/infiniband/$dev/ports/1/hw_counters/sent_pkts
pkts() { cat "$counter" 2>/dev/null || echo 0; }
common="--device $dev --gid-index $gid --op $op --block-size $size --batch $batch --threads $threads --depth $depth --qps $qps --seconds $secs"

# NIXL's wheel bundles a libibverbs that looks for providers in its own folder: preload it, and
# point it at the system's providers. rc_verbs (not shared memory, though both ends are local).
nixl_env=(env LD_PRELOAD="$(ls "$site"/nixl_cu12.libs/libibverbs-*.so* 2>/dev/null)"
    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/libibverbs
    UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES="$dev:1" UCX_IB_GID_INDEX="$gid" UCX_LOG_LEVEL=error)
mc_env=(env MC_GID_INDEX="$gid" MC_NUM_QP_PER_EP="$qps" MC_LOG_LEVEL=WARNING)
# Mooncake's C++ bench at its own log level (INFO: its result is an INFO line).
mc_bench=(env MC_GID_INDEX="$gid" MC_NUM_QP_PER_EP="$qps" "$PEERS_VENV/bin/transfer_engine_bench"
    --metadata_server=P2PHANDSHAKE --protocol=rdma --device_name="$dev" --buffer_size="$need"
    --batch_size="$batch" --block_size="$size" --threads="$threads")

# Sets cmd to the target's (side=target) or the initiator's command line of a tool.
command_of() {
    local tool=$1 side=$2
    case $tool,$side in
    gdr,target) cmd=("$GDR" xfer-bench --target -d "$dev" -x "$gid" --listen "127.0.0.1:$port"
        --buffer-size "$need" --verify) ;;
    gdr,initiator) cmd=("$GDR" xfer-bench "127.0.0.1:$port" -d "$dev" -x "$gid" --block-size "$size"
        --batch "$batch" -q "$qps" --duration "$secs" --threads "$threads" --depth "$depth" --op "$op"
        --csv --verify) ;;
    mooncake,*) cmd=("${mc_env[@]}" "$py" "$PEERS_DIR/mooncake_bench.py" --mode "$side" --port "$port" $common) ;;
    nixl,*) cmd=("${nixl_env[@]}" "$py" "$PEERS_DIR/nixl_bench.py" --mode "$side" --port "$port" $common) ;;
    mooncake-cpp,target) cmd=("${mc_bench[@]}" --mode=target --local_server_name="127.0.0.1:$port") ;;
    mooncake-cpp,initiator) cmd=("${mc_bench[@]}" --mode=initiator --local_server_name="127.0.0.1:$((port + 50))"
        --segment_id="$segment" --operation="$op" --duration="${secs%.*}" --report_unit=GB) ;;
    *) echo "compare-peers.sh: no tool $tool" >&2; exit 2 ;;
    esac
}

# The target is ready when it says it listens. Mooncake's C++ bench, with the P2P handshake,
# picks its own port and logs it ("P2P handshake, listening on 127.0.0.1:15850"): that is the
# segment name its initiator is given.
ready() {
    local t=0
    while [ $t -lt 600 ]; do
        if [ "$1" = mooncake-cpp ]; then
            segment=$(grep -o 'P2P handshake, listening on [0-9.]*:[0-9]*' "$2" 2>/dev/null | awk '{print $NF}')
            [ -n "$segment" ] && grep -q 'numa node num' "$2" && sleep 1 && return 0
        else
            grep -q listening "$2" 2>/dev/null && return 0
        fi
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.1
        t=$((t + 1))
    done
    return 1
}

run_tool() {
    local tool=$1 log spid rc src before after t cmd segment
    port=$((port + 1))
    log=$(mktemp)
    command_of "$tool" target
    "${cmd[@]}" >"$log" 2>&1 &
    spid=$!
    echo "### $tool round=$r"
    # The Python drivers' initiators wait for their target's control port themselves: they start
    # together (an interpreter's start is seconds under TCG); the others wait for the target.
    if [ "$tool" != mooncake ] && [ "$tool" != nixl ] && ! ready "$tool" "$log" $spid; then
        echo "compare-peers.sh: the $tool target did not come up"
        rc=125
    else
        before=$(pkts)
        command_of "$tool" initiator
        timeout $((${secs%.*} + 180)) "${cmd[@]}" 2>&1
        rc=$?
        after=$(pkts)
    fi
    if [ "$tool" = mooncake-cpp ]; then
        # Its target serves until it is stopped.
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        src=0
    else
        t=0
        while kill -0 "$spid" 2>/dev/null && [ $t -lt 200 ]; do sleep 0.1; t=$((t + 1)); done
        kill "$spid" 2>/dev/null
        wait "$spid"
        src=$?
    fi
    sed 's/^/target: /' "$log"
    rm -f "$log"
    echo "### pkts sent=$((${after:-0} - ${before:-0}))"
    echo "### end rc=$rc server_rc=$src"
}

IFS=, read -r -a list <<<"$tools"
n=${#list[@]}
r=1
while [ "$r" -le "$rounds" ]; do
    # The order rotates by round, so that going first or last favours no tool.
    i=0
    while [ $i -lt "$n" ]; do
        run_tool "${list[$(((i + r - 1) % n))]}"
        i=$((i + 1))
    done
    r=$((r + 1))
done
echo "### done"
