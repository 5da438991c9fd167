#!/bin/sh
# Runs `gdr xfer-bench` (gdr-xfer: batches of BATCH blocks of SIZE bytes) and perftest's
# ib_write_bw or ib_read_bw (messages of SIZE bytes; OP is write, the default, or read)
# alternately on one RDMA device, both with QPS queue pairs and for SECONDS each, server/target
# and client/initiator as two processes on this host, and prints each client's result between
# markers that `cargo xtask compare-xfer` parses. Each gdr-xfer thread keeps DEPTH batches in
# flight (default 2); $XFER_ARGS, when set, adds options to the gdr-xfer initiator (split on
# spaces: `--busy-poll-us 0`).
#
# usage: compare-xfer.sh DEVICE GID_INDEX ADDR GDR_BINARY ROUNDS SIZE BATCH QPS SECONDS THREADS [OP] [DEPTH]
#   ADDR: this host's address on DEVICE (- takes $GDR_TEST_ADDR, as in the Soft-RoCE VM).
# On real hardware: compare-xfer.sh mlx5_0 3 192.168.1.10 target/release/gdr 5 65536 128 2 5 1 write 2
set -u
dev=$1 gid=$2 addr=$3 gdr=$4
[ "$addr" = "-" ] && addr=${GDR_TEST_ADDR:?ADDR is - but GDR_TEST_ADDR is not set}
rounds=$5 size=$6 batch=$7 qps=$8 secs=$9 threads=${10} op=${11:-write} depth=${12:-2}
case "$op" in write | read) ;; *) echo "compare-xfer.sh: OP must be write or read, not $op" >&2; exit 2 ;; esac
port=${PORT_BASE:-18720}

# Stops a server that outlived its client by 10 s, and reports both exit codes.
finish() {
    t=0
    while kill -0 "$1" 2>/dev/null && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
    kill "$1" 2>/dev/null
    wait "$1"
    echo "### end rc=$2 server_rc=$?"
}

# perftest's send queue depth: its default 128, but at most 16 MiB in flight per QP, so that a
# timed run of large messages on a slow device (Soft-RoCE: about 70 MB/s) is not over before
# the first of them completes (ib_write_bw -s 1048576 -q 2 -D 4 then reports 0).
tx=$((16777216 / size))
[ "$tx" -gt 128 ] && tx=128
[ "$tx" -lt 1 ] && tx=1

perftest() {
    port=$((port + 1))
    "ib_${op}_bw" -d "$dev" -x "$gid" -s "$size" -q "$qps" -t "$tx" -D "$secs" -p $port >/dev/null 2>&1 &
    spid=$!
    sleep 1
    echo "### perftest size=$size round=$r"
    "ib_${op}_bw" "$addr" -d "$dev" -x "$gid" -s "$size" -q "$qps" -t "$tx" -D "$secs" -p $port 2>&1
    finish $spid $?
}

xfer() {
    port=$((port + 1))
    "$gdr" xfer-bench --target -d "$dev" -x "$gid" --listen "127.0.0.1:$port" >/dev/null 2>&1 &
    spid=$!
    sleep 1
    echo "### xfer size=$size round=$r"
    "$gdr" xfer-bench "127.0.0.1:$port" -d "$dev" -x "$gid" --block-size "$size" --batch "$batch" \
        -q "$qps" --duration "$secs" --threads "$threads" --depth "$depth" --op "$op" --csv \
        ${XFER_ARGS:-} 2>&1
    finish $spid $?
}

r=1
while [ "$r" -le "$rounds" ]; do
    # Who goes first alternates by round, so an advantage of going first or second cancels.
    if [ $((r % 2)) -eq 1 ]; then xfer; perftest; else perftest; xfer; fi
    r=$((r + 1))
done
echo "### done"
