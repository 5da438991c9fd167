#!/usr/bin/env bash
# Runs the cases of `cargo xtask compare-peers` on one RDMA device: gdr xfer-bench and the peers
# (Mooncake TE's Python batch API, Mooncake's C++ transfer_engine_bench, NIXL's Python API over
# UCX) with the same workload, target and initiator as two processes on this host, ROUNDS
# rounds with the tools' order rotating. Each run's section of the output, which the xtask
# parses (a case's sections come from every round and tool; the xtask gathers them):
#   ### case op=OP size=S batch=B qps=Q threads=T
#   ### TOOL round=R
#   (the initiator's output)
#   target: (the target's output)
#   ### pkts sent=N
#   ### cpu busy=B0,B1 softirq=S0,S1   (each vCPU's share of the timed part, in percent)
#   ### end rc=A server_rc=B
# gdr and Mooncake's C++ bench start a target and an initiator for every case. The Python
# drivers start one pair per round (and QP count) that runs every case, and print the sections
# themselves (an interpreter's and an engine's start cost seconds under TCG).
# Every tool but Mooncake's C++ bench checks its data (both sides compute a digest); the rxe
# packet counter shows that the traffic crossed the device (a silent TCP fallback sends none).
#
# usage: compare-peers.sh DEVICE GID_INDEX ROUNDS SECONDS DEPTH TOOLS CASE...
#   TOOLS: comma-separated, of gdr, mooncake, mooncake-cpp, nixl, nixl-on-gdr and
#     mooncake-on-gdr (the Python drivers on gdr's drop-ins), and gdr-NAME: a variant of gdr,
#     xfer-bench with the extra arguments in GDR_ARGS_NAME (target and initiator).
#   CASE: OP:SIZE:BATCH:QPS:THREADS, e.g. write:65536:256:2:1.
# Environment: GDR (the gdr binary), PEERS_VENV (the peers' virtual environment), PEERS_DIR
# (the drivers' folder), GDR_PY (the Python of the wheel's venv, for the *-on-gdr tools),
# PORT_BASE.
set -u
dev=$1 gid=$2 rounds=$3 secs=$4 depth=$5 tools=$6
shift 6
cases=("$@")
group= # the cases a Python driver pair runs
port=${PORT_BASE:-19720}
py="$PEERS_VENV/bin/python"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
counters_dir=/sys/class/infiniband/$dev/ports/1/hw_counters
# Every counter of the device (rxe's hw_counters), a "name value" line each.
counters() {
    local f
    for f in "$counters_dir"/*; do
        [ -r "$f" ] && echo "${f##*/} $(cat "$f" 2>/dev/null || echo 0)"
    done
}
# The line that closes a run's counters, from the counters before ($1) and after ($2): the
# packets it sent, then every other counter that moved ("### pkts sent=N name=delta ...").
# (One stream with a separator line: the VM has no /dev/fd for process substitution.)
pkts_line() {
    printf '%s\n--\n%s\n' "$1" "$2" | awk '$0 == "--" { after = 1; next }
        !after { b[$1] = $2; next }
        { d = $2 - b[$1]; if ($1 == "sent_pkts") s = d; else if (d) o = o " " $1 "=" d }
        END { print "### pkts sent=" s + 0 o }'
}

# The per-CPU lines of /proc/stat (cpuN user nice system idle iowait irq softirq steal ...).
cpu_stat() { grep '^cpu[0-9]' /proc/stat; }
# The line of a run's CPU use, from two cpu_stat snapshots ($1 before, $2 after): each vCPU's
# busy share of the time between them (all but idle and iowait) and its softirq share (where
# rxe's protocol work runs), in percent, in CPU order ("### cpu busy=B0,B1 softirq=S0,S1").
cpu_line() {
    printf '%s\n--\n%s\n' "$1" "$2" | awk '$0 == "--" { after = 1; next }
        { t = 0; for (i = 2; i <= 9; i++) t += $i; idle = $5 + $6 }
        !after { bt[$1] = t; bi[$1] = idle; bs[$1] = $8; next }
        { dt = t - bt[$1]; if (dt <= 0) dt = 1
          b = b sep int(100 * (dt - (idle - bi[$1])) / dt + 0.5)
          q = q sep int(100 * ($8 - bs[$1]) / dt + 0.5); sep = "," }
        END { print "### cpu busy=" b " softirq=" q }'
}
# Samples the CPUs in the timed part of a native tool's run, whose initiator writes its output
# to the file $1: gdr xfer-bench says when its timed part starts ("xfer-bench: measuring"),
# Mooncake's C++ bench does not, so its part is taken to start 1.5 s after the initiator.
# The sample ends 0.25 s before the timed part would. Prints the cpu line when done (nothing
# for runs under 2 s, or when the marker never came); run it in the background.
cpu_window() {
    local out=$1 len a b t=0
    [ "${secs%.*}" -ge 2 ] || return 0
    if [[ $tool == gdr* ]]; then
        until grep -q 'xfer-bench: measuring' "$out" 2>/dev/null; do
            [ $t -lt 3000 ] || return 0
            sleep 0.05
            t=$((t + 1))
        done
        len=$(awk -v s="$secs" 'BEGIN { print s - 0.25 }')
    else
        sleep 1.5
        len=$(awk -v s="$secs" 'BEGIN { print s - 1.75 }')
    fi
    a=$(cpu_stat)
    sleep "$len"
    b=$(cpu_stat)
    cpu_line "$a" "$b"
}

# Sets the case's variables (op size batch qps threads need) from OP:SIZE:BATCH:QPS:THREADS.
use_case() {
    IFS=: read -r op size batch qps threads <<<"$1"
    need=$((size * batch * threads * depth))
}
marker() { echo "### case op=$op size=$size batch=$batch qps=$qps threads=$threads"; }

# NIXL's wheel bundles a libibverbs that looks for providers in its own folder: preload it, and
# point it at the system's providers. rc_verbs (not shared memory, though both ends are local).
nixl_env=(env LD_PRELOAD="$(ls "$site"/nixl_cu12.libs/libibverbs-*.so* 2>/dev/null)"
    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/libibverbs
    UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES="$dev:1" UCX_IB_GID_INDEX="$gid" UCX_LOG_LEVEL=error)
# Mooncake's settings depend on the case (its QPs per endpoint, the C++ bench's buffer).
mooncake_env() {
    mc_env=(env MC_GID_INDEX="$gid" MC_NUM_QP_PER_EP="$qps" MC_LOG_LEVEL=WARNING)
    # Mooncake's C++ bench at its own log level (INFO: its result is an INFO line).
    mc_bench=(env MC_GID_INDEX="$gid" MC_NUM_QP_PER_EP="$qps" "$PEERS_VENV/bin/transfer_engine_bench"
        --metadata_server=P2PHANDSHAKE --protocol=rdma --device_name="$dev" --buffer_size="$need"
        --batch_size="$batch" --block_size="$size" --threads="$threads")
}

# Sets cmd to the target's (side=target) or the initiator's command line of a tool.
command_of() {
    local tool=$1 side=$2 common extra=()
    if [[ $tool == gdr-* ]]; then
        local v=GDR_ARGS_${tool#gdr-}
        read -r -a extra <<<"${!v-}"
        tool=gdr
    fi
    common="--device $dev --gid-index $gid --cases $group --depth $depth --seconds $secs --round $r"
    mooncake_env
    case $tool,$side in
    gdr,target) cmd=("$GDR" xfer-bench --target -d "$dev" -x "$gid" --listen "127.0.0.1:$port"
        --buffer-size "$need" --verify "${extra[@]}") ;;
    gdr,initiator) cmd=("$GDR" xfer-bench "127.0.0.1:$port" -d "$dev" -x "$gid" --block-size "$size"
        --batch "$batch" -q "$qps" --duration "$secs" --threads "$threads" --depth "$depth" --op "$op"
        --csv --verify "${extra[@]}") ;;
    mooncake,*) cmd=("${mc_env[@]}" "$py" "$PEERS_DIR/mooncake_bench.py" --mode "$side" --port "$port" $common) ;;
    nixl,*) cmd=("${nixl_env[@]}" "$py" "$PEERS_DIR/nixl_bench.py" --mode "$side" --port "$port" $common) ;;
    # The same drivers, unchanged, on gdr's drop-ins: as_gdr/ answers their imports.
    nixl-on-gdr,*) cmd=(env UCX_NET_DEVICES="$dev:1" UCX_IB_GID_INDEX="$gid" COMPARE_PEERS_TOOL="$tool"
        PYTHONPATH="$PEERS_DIR/as_gdr" "$GDR_PY" "$PEERS_DIR/nixl_bench.py" --mode "$side" --port "$port" $common) ;;
    mooncake-on-gdr,*) cmd=(env MC_GID_INDEX="$gid" MC_NUM_QP_PER_EP="$qps" COMPARE_PEERS_TOOL="$tool"
        PYTHONPATH="$PEERS_DIR/as_gdr" "$GDR_PY" "$PEERS_DIR/mooncake_bench.py" --mode "$side" --port "$port" $common) ;;
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

# Stops a target: Mooncake's C++ bench serves until it is stopped; the others end by
# themselves after the initiator's last message (given 20 s). Sets src to its exit code.
stop_target() {
    local tool=$1 spid=$2 t=0
    if [ "$tool" = mooncake-cpp ]; then
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        src=0
    else
        while kill -0 "$spid" 2>/dev/null && [ $t -lt 200 ]; do sleep 0.1; t=$((t + 1)); done
        kill "$spid" 2>/dev/null
        wait "$spid"
        src=$?
    fi
}

# One case of gdr or Mooncake's C++ bench: a target, then an initiator once it is ready.
run_native() {
    local tool=$1 log spid rc src before after cmd segment cpu= out sampler
    port=$((port + 1))
    log=$(mktemp)
    command_of "$tool" target
    "${cmd[@]}" >"$log" 2>&1 &
    spid=$!
    marker
    echo "### $tool round=$r"
    if ! ready "$tool" "$log" $spid; then
        echo "compare-peers.sh: the $tool target did not come up"
        rc=125
    else
        before=$(counters)
        command_of "$tool" initiator
        cpu=$(mktemp) out=$(mktemp)
        cpu_window "$out" >"$cpu" &
        sampler=$!
        timeout $((${secs%.*} + 180)) "${cmd[@]}" 2>&1 | tee "$out"
        rc=${PIPESTATUS[0]}
        after=$(counters)
        # An initiator that ended before its timed part leaves the sampler waiting for the
        # marker: stop it (no cpu line then).
        [[ $tool == gdr* ]] && ! grep -q 'xfer-bench: measuring' "$out" && kill "$sampler" 2>/dev/null
        wait "$sampler"
        rm -f "$out"
    fi
    stop_target "$tool" "$spid"
    sed 's/^/target: /' "$log"
    rm -f "$log"
    pkts_line "${before:-}" "${after:-}"
    [ -n "${cpu:-}" ] && cat "$cpu" && rm -f "$cpu"
    cpu=
    echo "### end rc=$rc server_rc=$src"
}

# The cases of group (comma-separated, one QP count) with one Python driver pair, which prints
# each case's section. A failed case ends the initiator with its section open: close it here.
# A target that fails after the last case closed gets a failed run of its own in that case.
run_python() {
    local tool=$1 log spid rc src cmd n_cases
    port=$((port + 1))
    log=$(mktemp)
    command_of "$tool" target
    "${cmd[@]}" >"$log" 2>&1 &
    spid=$!
    # The initiator waits for its target's control port itself: they start together.
    command_of "$tool" initiator
    n_cases=$(($(tr -cd , <<<"$group" | wc -c) + 1))
    timeout $((n_cases * (${secs%.*} + 60) + 180)) "${cmd[@]}" 2>&1
    rc=$?
    stop_target "$tool" "$spid"
    sed 's/^/target: /' "$log"
    rm -f "$log"
    if [ $rc -ne 0 ]; then
        echo "### end rc=$rc server_rc=$src"
    elif [ "$src" -ne 0 ]; then
        use_case "${group##*,}"
        marker
        echo "### $tool round=$r"
        echo "### end rc=0 server_rc=$src"
    fi
}

# The QP counts of the cases, in their order: a Python driver pair serves one.
qp_counts=()
for c in "${cases[@]}"; do
    use_case "$c"
    [[ " ${qp_counts[*]} " == *" $qps "* ]] || qp_counts+=("$qps")
done

IFS=, read -r -a list <<<"$tools"
n=${#list[@]}
r=1
while [ "$r" -le "$rounds" ]; do
    # The order rotates by round, so that going first or last favours no tool.
    i=0
    while [ $i -lt "$n" ]; do
        tool=${list[$(((i + r - 1) % n))]}
        case $tool in
        mooncake | nixl | *-on-gdr)
            for q in "${qp_counts[@]}"; do
                group=
                for c in "${cases[@]}"; do
                    use_case "$c"
                    [ "$qps" = "$q" ] && group=${group:+$group,}$c
                done
                qps=$q
                run_python "$tool"
            done
            ;;
        *)
            for c in "${cases[@]}"; do
                use_case "$c"
                run_native "$tool"
            done
            ;;
        esac
        i=$((i + 1))
    done
    r=$((r + 1))
done
echo "### done"
