#!/bin/sh
# N hosts on one segment per rail (`cargo xtask cluster --hosts N`): every host pings every other
# host on every rail, then, rail by rail, runs an `ib_write_bw` server for the previous host and a
# client to the next host (a ring: host k -> host k+1, host N -> host 1).
#   cargo xtask cluster --hosts 3 --rails 2 -- sh xtask/scenarios/ring.sh
set -e
size=${SIZE:-65536}
iters=${ITERS:-200}
me=$GDR_HOST_INDEX
next=$((me % GDR_HOSTS + 1))
r=0
while [ "$r" -lt "$GDR_RAILS" ]; do
    for p in $GDR_PEERS; do
        addr=$(eval echo "\$GDR_HOST${p}_RAIL${r}_ADDR")
        busybox ping -c 2 -W 5 -I "eth$r" "$addr" >/tmp/ping.out 2>&1 ||
            { cat /tmp/ping.out; echo "ping host$p rail $r ($addr): FAILED"; exit 1; }
        echo "ping host$p rail $r ($addr): $(grep -o '[0-9]* packets received' /tmp/ping.out)"
    done
    r=$((r + 1))
done
r=0
while [ "$r" -lt "$GDR_RAILS" ]; do
    dev=$(eval echo "\$GDR_RAIL${r}_DEVICE")
    gid=$(eval echo "\$GDR_RAIL${r}_GID_INDEX")
    port=$((19200 + r))
    peer=$(eval echo "\$GDR_HOST${next}_RAIL${r}_ADDR")
    ib_write_bw -d "$dev" -x "$gid" -s "$size" -n "$iters" -p "$port" -F --report_gbits \
        >/tmp/srv.$r 2>&1 &
    srv=$!
    i=0
    until ib_write_bw -d "$dev" -x "$gid" -s "$size" -n "$iters" -p "$port" -F --report_gbits \
        "$peer" >/tmp/cli.$r 2>&1; do
        i=$((i + 1))
        [ "$i" -lt 40 ] || { cat /tmp/cli.$r; echo "rail $r: client to host$next FAILED"; exit 1; }
        sleep 0.5
    done
    echo "rail $r: $dev -> host$next ($peer): $(grep -A1 '#bytes' /tmp/cli.$r | tail -1)"
    wait "$srv" || { cat /tmp/srv.$r; echo "rail $r: server FAILED"; exit 1; }
    r=$((r + 1))
done
echo "ring done on $GDR_RAILS rail(s)"
