#!/bin/sh
# Link and power faults on a shared rail segment (3+ hosts): host 1 cuts host 2's rail 0 and
# checks that host 2 is unreachable there while host 3 and host 2's rail 1 still answer, restores
# it, then kills host 3 and checks that hosts 1 and 2 still reach each other on every rail.
#   cargo xtask cluster --hosts 3 -- sh xtask/scenarios/segment-faults.sh
set -e
[ "$GDR_HOSTS" -ge 3 ] || { echo "needs --hosts 3 or more"; exit 2; }
D=$GDR_CLUSTER_DIR
if [ "$GDR_HOST_INDEX" != 1 ]; then
    while [ ! -f "$D/segment-faults.done" ]; do sleep 0.2; done
    exit 0
fi
reach() { # host rail
    busybox ping -c 2 -W 3 -I "eth$2" "$(eval echo "\$GDR_HOST${1}_RAIL${2}_ADDR")" >/dev/null 2>&1
}
expect() { # yes|no host rail
    if reach "$2" "$3"; then got=yes; else got=no; fi
    echo "host$2 rail $3 reachable: $got (want $1)"
    [ "$got" = "$1" ]
}
expect yes 2 0
expect yes 3 0
gdr-fault link-down 2 0
expect no 2 0
expect yes 3 0
expect yes 2 1
gdr-fault link-up 2 0
sleep 1
expect yes 2 0
gdr-fault kill 3
r=0
while [ "$r" -lt "$GDR_RAILS" ]; do
    expect yes 2 "$r"
    expect no 3 "$r"
    r=$((r + 1))
done
touch "$D/segment-faults.done"
echo "segment faults ok"
