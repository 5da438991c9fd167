#!/bin/sh
# gdr-fault: fault controls of a `cargo xtask cluster` run, callable from any host's scenario.
#   gdr-fault link-down HOST RAIL    cut HOST's rail RAIL (QEMU set_link off: carrier lost)
#   gdr-fault link-up HOST RAIL      restore it
#   gdr-fault kill HOST              power HOST off at once (its QEMU is killed)
#   gdr-fault netem HOST RAIL ARGS   tc netem on HOST's eth<RAIL>, e.g. `loss 1%`, `delay 5ms`
#   gdr-fault netem-clear HOST RAIL  remove it
# Waits until the fault is in place (or failed) and prints the result; exit 0 on success.
# link-down/link-up/kill are done by xtask on the host machine, netem by HOST's own fault watcher.
# Every fault is logged with a UTC timestamp in xtask's output and $GDR_CLUSTER_DIR/faults.log.
R=${GDR_CLUSTER_DIR:-/run/gdr-vm/results}
usage() {
    sed -n '2,10s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
[ $# -ge 2 ] || usage
case "$1" in
link-down | link-up) [ $# -eq 3 ] || usage; dir="$R/req" ;;
kill) [ $# -eq 2 ] || usage; dir="$R/req" ;;
netem) [ $# -ge 4 ] || usage; dir="$R/inbox.host$2" ;;
netem-clear) [ $# -eq 3 ] || usage; dir="$R/inbox.host$2" ;;
*) usage ;;
esac
case "$1" in
netem | netem-clear)
    what=$1 host=$2
    shift 2
    set -- "$what" "$@"
    [ -d "$dir" ] || { echo "gdr-fault: no host $host" >&2; exit 2; } ;;
esac
mkdir -p "$dir"
id="$(date +%s%N)-${GDR_HOST_INDEX:-0}-$$"
echo "$*" >"$dir/$id.tmp" && mv "$dir/$id.tmp" "$dir/$id.req" || exit 1
i=0
while [ ! -f "$dir/$id.done" ]; do
    i=$((i + 1))
    [ "$i" -le 300 ] || { echo "gdr-fault: no answer to '$*' after 30 s" >&2; exit 1; }
    sleep 0.1
done
res=$(cat "$dir/$id.done")
rm -f "$dir/$id.done"
echo "gdr-fault: $*: $res"
[ "$res" = ok ]
