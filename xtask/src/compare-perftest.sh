#!/bin/sh
# Runs `gdr bw`/`gdr lat` and perftest's ib_write_bw/ib_write_lat alternately on one RDMA device
# (server and client as two processes on this host, talking through ADDR) and prints every
# client's output between markers that `cargo xtask compare-perftest` parses. Bandwidth runs
# report MiB/s (two decimals: four or more significant digits, where Gb/s would give two).
#
# usage: compare-perftest.sh DEVICE GID_INDEX ADDR GDR_BINARY ROUNDS SIZES [LAT_ITERS] [RATE_ITERS] [POST_LIST]
#   ADDR: this host's address on DEVICE (- takes $GDR_TEST_ADDR, as in the Soft-RoCE VM).
#   SIZES: comma-separated write-bandwidth sizes; iterations per size: 64 MiB / size, within 200..5000.
#   POST_LIST: requests per doorbell for both tools' bandwidth runs (-l N); - keeps each tool's
#   default (gdr automatic: up to 16 requests and 64 KiB per doorbell; perftest 1).
# Bandwidth runs give both tools the same QP count (1), tx depth (128) and completion moderation
# (100: perftest would drop to 1 above 8 KiB unless -Q is given; gdr keeps 100).
# On real hardware: compare-perftest.sh mlx5_0 3 192.168.1.10 target/release/gdr 3 4096,65536,1048576
set -u
dev=$1 gid=$2 addr=$3 gdr=$4
[ "$addr" = "-" ] && addr=${GDR_TEST_ADDR:?ADDR is - but GDR_TEST_ADDR is not set} rounds=$5 sizes=$6 lat_iters=${7:-1000} rate_iters=${8:-5000} post_list=${9:--}
pl=""; [ "$post_list" != "-" ] && pl="-l $post_list"
port=18620

# run NAME SERVER_CMD... -- CLIENT_CMD...: server in the background, then the client.
run() {
    name=$1; shift
    srv=""; while [ "$1" != "--" ]; do srv="$srv '$1'"; shift; done; shift
    port=$((port + 1))
    eval "$srv -p $port" >/dev/null 2>&1 &
    spid=$!
    sleep 1
    echo "### $name"
    "$@" -p $port 2>&1
    rc=$?
    # a server whose client failed would wait forever: give it 10 s to finish, then stop it.
    t=0
    while kill -0 $spid 2>/dev/null && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
    kill $spid 2>/dev/null
    wait $spid
    echo "### end rc=$rc server_rc=$?"
}

iters_for() {
    n=$((67108864 / $1)); [ $n -gt 5000 ] && n=5000; [ $n -lt 200 ] && n=200; echo $n
}

# one KIND TOOL SIZE: one measurement (KIND bw, rate or lat; TOOL gdr or perftest).
one() {
    kind=$1 tool=$2 s=$3
    case "$kind/$tool" in
    bw/gdr)
        run "gdr bw size=$s round=$r" "$gdr" bw --server -d "$dev" -x "$gid" -- \
            "$gdr" bw "$addr" -d "$dev" -x "$gid" -s "$s" -n "$n" -q 1 -t 128 --cq-mod 100 $pl ;;
    bw/perftest)
        run "perftest bw size=$s round=$r" ib_write_bw -d "$dev" -x "$gid" -s "$s" -n "$n" -q 1 -t 128 -Q 100 $pl -- \
            ib_write_bw "$addr" -d "$dev" -x "$gid" -s "$s" -n "$n" -q 1 -t 128 -Q 100 $pl ;;
    rate/gdr)
        run "gdr rate size=2 round=$r" "$gdr" bw --server -d "$dev" -x "$gid" -- \
            "$gdr" bw "$addr" -d "$dev" -x "$gid" -s 2 -n "$rate_iters" -q 1 -t 128 --report-gbits $pl ;;
    rate/perftest)
        run "perftest rate size=2 round=$r" ib_write_bw -d "$dev" -x "$gid" -s 2 -n "$rate_iters" --report_gbits $pl -- \
            ib_write_bw "$addr" -d "$dev" -x "$gid" -s 2 -n "$rate_iters" --report_gbits $pl ;;
    lat/gdr)
        run "gdr lat size=2 round=$r" "$gdr" lat --server -d "$dev" -x "$gid" -- \
            "$gdr" lat "$addr" -d "$dev" -x "$gid" -s 2 -n "$lat_iters" ;;
    lat/perftest)
        run "perftest lat size=2 round=$r" ib_write_lat -d "$dev" -x "$gid" -s 2 -n "$lat_iters" -- \
            ib_write_lat "$addr" -d "$dev" -x "$gid" -s 2 -n "$lat_iters" ;;
    esac
}

# both KIND SIZE: the two tools back to back; who goes first alternates by round, so that an
# advantage of going first or second (caches, leftover kernel work of the previous run) cancels.
both() {
    if [ $((r % 2)) -eq 1 ]; then one "$1" gdr "$2"; one "$1" perftest "$2"
    else one "$1" perftest "$2"; one "$1" gdr "$2"; fi
}

r=1
while [ $r -le "$rounds" ]; do
    for s in $(echo "$sizes" | tr ',' ' '); do
        n=$(iters_for "$s")
        both bw "$s"
    done
    both rate 2
    both lat 2
    r=$((r + 1))
done
echo "### done"
