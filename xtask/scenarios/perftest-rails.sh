#!/bin/sh
# ib_write_bw across the two hosts of `cargo xtask cluster`: on each rail alone, then on every
# rail at once. Host 1 serves, host 2 connects to host 1's address on the rail.
#   cargo xtask cluster -- sh xtask/scenarios/perftest-rails.sh
set -e
size=${SIZE:-65536}
iters=${ITERS:-1000}
bw() { # rail port
    dev=$(eval echo "\$GDR_RAIL${1}_DEVICE")
    gid=$(eval echo "\$GDR_RAIL${1}_GID_INDEX")
    if [ "$GDR_HOST_INDEX" = 1 ]; then
        ib_write_bw -d "$dev" -x "$gid" -s "$size" -n "$iters" -p "$2" -F --report_gbits
    else
        peer=$(eval echo "\$GDR_HOST1_RAIL${1}_ADDR")
        i=0
        until ib_write_bw -d "$dev" -x "$gid" -s "$size" -n "$iters" -p "$2" -F --report_gbits "$peer"; do
            i=$((i + 1)); [ "$i" -lt 20 ] || return 1; sleep 0.5
        done
    fi
}
r=0
while [ "$r" -lt "$GDR_RAILS" ]; do
    echo "== rail $r alone"
    bw "$r" $((19000 + r)) | grep -A1 "#bytes"
    r=$((r + 1))
done
echo "== all $GDR_RAILS rails at once"
r=0
pids=
while [ "$r" -lt "$GDR_RAILS" ]; do
    (bw "$r" $((19100 + r)) | grep -A1 "#bytes" | sed "s/^/rail $r: /") &
    pids="$pids $!"
    r=$((r + 1))
done
for p in $pids; do wait "$p"; done
