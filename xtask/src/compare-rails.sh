#!/bin/sh
# Runs on every host of a 2-host x 2-rail cluster (`cargo xtask compare-rails`): host 1 serves,
# host 2 measures, each round (in an order that rotates) `gdr xfer-bench` on rail 0 alone,
# `gdr xfer-bench` on both rails, perftest's ib_write_bw on both rails at once (one client per
# rail) and on rail 0 alone, and prints each client's result between markers that
# `cargo xtask compare-rails` parses.
#
# usage: compare-rails.sh GDR_BINARY ROUNDS SIZE BATCH QPS SECONDS
set -u
gdr=$1 rounds=$2 size=$3 batch=$4 qps=$5 secs=$6
h=$GDR_HOST_INDEX
d0=$GDR_RAIL0_DEVICE d1=$GDR_RAIL1_DEVICE
g0=$GDR_RAIL0_GID_INDEX g1=$GDR_RAIL1_GID_INDEX
a0=$GDR_HOST1_RAIL0_ADDR a1=$GDR_HOST1_RAIL1_ADDR
limit=$((secs * 4 + 60))
port=18800

# Retries a client until its server listens (at most 20 times, every 0.5 s).
retry() {
    n=0
    until "$@"; do
        n=$((n + 1))
        [ $n -ge 20 ] && return 1
        sleep 0.5
    done
}

xfer() { # LABEL DEVICES
    port=$((port + 1))
    if [ "$h" = 1 ]; then
        timeout $limit "$gdr" xfer-bench --target -d "$2" --listen "$a0:$port" >/dev/null 2>&1
    else
        sleep 2
        echo "### $1 size=$size round=$r"
        "$gdr" xfer-bench "$a0:$port" -d "$2" --block-size "$size" --batch "$batch" -q "$qps" \
            --duration "$secs" --csv 2>&1
        echo "### end rc=$? server_rc=0"
    fi
}

# perftest on rail 0 alone: how far the test bed itself scales from one rail to two.
perf_one() {
    port=$((port + 1))
    if [ "$h" = 1 ]; then
        timeout $limit ib_write_bw -d "$d0" -x "$g0" -s "$size" -q "$qps" -D "$secs" -p $port >/dev/null 2>&1
    else
        sleep 2
        echo "### perfone size=$size round=$r"
        retry ib_write_bw "$a0" -d "$d0" -x "$g0" -s "$size" -q "$qps" -D "$secs" -p $port 2>&1
        echo "### end rc=$? server_rc=0"
    fi
}

perf() {
    p0=$((port + 1)) p1=$((port + 2))
    port=$((port + 2))
    if [ "$h" = 1 ]; then
        timeout $limit ib_write_bw -d "$d0" -x "$g0" -s "$size" -q "$qps" -D "$secs" -p $p0 >/dev/null 2>&1 &
        s0=$!
        timeout $limit ib_write_bw -d "$d1" -x "$g1" -s "$size" -q "$qps" -D "$secs" -p $p1 >/dev/null 2>&1 &
        s1=$!
        wait $s0
        wait $s1
    else
        sleep 2
        (retry ib_write_bw "$a0" -d "$d0" -x "$g0" -s "$size" -q "$qps" -D "$secs" -p $p0 >/tmp/perf0 2>&1
         echo $? >/tmp/perf0.rc) &
        c0=$!
        (retry ib_write_bw "$a1" -d "$d1" -x "$g1" -s "$size" -q "$qps" -D "$secs" -p $p1 >/tmp/perf1 2>&1
         echo $? >/tmp/perf1.rc) &
        c1=$!
        wait $c0
        wait $c1
        for k in 0 1; do
            echo "### perf$k size=$size round=$r"
            cat /tmp/perf$k
            echo "### end rc=$(cat /tmp/perf$k.rc) server_rc=0"
        done
    fi
}

# The rails as the doctor (and so the engine) ranks them on this host.
[ "$h" = 2 ] && "$gdr" doctor 2>&1 | sed -n '/^Rails/,/^$/p'

r=1
while [ "$r" -le "$rounds" ]; do
    # The order rotates by round, so an advantage of going first or last cancels out.
    case $((r % 3)) in
    1) xfer xfer1 "$d0"; xfer xfer2 "$d0,$d1"; perf; perf_one ;;
    2) xfer xfer2 "$d0,$d1"; perf; perf_one; xfer xfer1 "$d0" ;;
    0) perf_one; perf; xfer xfer1 "$d0"; xfer xfer2 "$d0,$d1" ;;
    esac
    r=$((r + 1))
done
[ "$h" = 2 ] && echo "### done"
exit 0
