# Stage 2 of a gdr cluster host (`cargo xtask cluster`, xtask/src/cluster.rs): runs as root inside
# the host's root (chroot, read-only 9p), selected by `gdr.stage2=cluster` on the kernel command
# line, which also carries `gdr.host=<index>` (1-based). Names the rail NICs by their MAC
# (52:54:00:78:<rail>:<host>) eth0..eth{M-1}, gives each 10.78.<rail>.<host>/24, adds rxe<rail> on
# it, waits until every port is ACTIVE with its RoCE v2 IPv4 GID, meets the other hosts at a barrier
# in the shared results directory, starts the fault watcher (netem requests for this host), and
# runs the scenario ($R/cmd.sh). Its exit code goes to $R/exit.host<index> and into the end marker.
R=/run/gdr-vm/results
H=
for w in $(cat /proc/cmdline); do
    case "$w" in gdr.host=*) H=${w#gdr.host=} ;; esac
done
# GDR_VM_MEMLOCK, GDR_VM_CWD, GDR_VM_NONCE, GDR_VM_TERM, GDR_HOSTS, GDR_RAILS, GDR_CLUSTER_BARRIER.
. "$R/env"
NONCE="$GDR_VM_NONCE-h$H"

fail() {
    echo "gdr-vm: host$H: $*"
    echo 125 >"$R/exit.host$H"
    exit 125
}
[ -n "$H" ] || fail "no gdr.host=<index> on the kernel command line"

export PATH="$R/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export HOME=/root LANG=C.UTF-8 TERM="$GDR_VM_TERM"
export GDR_IN_VM=1 GDR_IN_CLUSTER=1 GDR_VM_RESULTS="$R" GDR_CLUSTER_DIR="$R"
export GDR_HOST_INDEX="$H" GDR_HOSTS GDR_RAILS GDR_FAULT="$R/bin/gdr-fault"

command -v ip >/dev/null && command -v rdma >/dev/null ||
    fail "ip/rdma (iproute2) missing on the host: run cargo xtask setup"
ip link set lo up

# Name the NICs by MAC: first every rail NIC to a temporary name, then to eth<rail>.
r=0
while [ "$r" -lt "$GDR_RAILS" ]; do
    mac=$(printf '52:54:00:78:%02x:%02x' "$r" "$H")
    dev=
    for d in /sys/class/net/*; do
        [ "$(cat "$d/address" 2>/dev/null)" = "$mac" ] && dev=${d##*/}
    done
    [ -n "$dev" ] || fail "no NIC with MAC $mac (rail $r)"
    ip link set dev "$dev" name "gdrtmp$r" || fail "cannot rename $dev"
    r=$((r + 1))
done
peers=
h=1
while [ "$h" -le "$GDR_HOSTS" ]; do
    [ "$h" -eq "$H" ] || peers="$peers${peers:+ }$h"
    h=$((h + 1))
done
export GDR_PEERS="$peers"
r=0
while [ "$r" -lt "$GDR_RAILS" ]; do
    ip link set dev "gdrtmp$r" name "eth$r" || fail "cannot rename gdrtmp$r to eth$r"
    ip addr add "10.78.$r.$H/24" dev "eth$r" || fail "cannot address eth$r"
    ip link set "eth$r" up || fail "cannot bring eth$r up"
    rdma link add "rxe$r" type rxe netdev "eth$r" || fail "rdma link add rxe$r failed"
    export "GDR_RAIL${r}_DEVICE=rxe$r" "GDR_RAIL${r}_NETDEV=eth$r" "GDR_RAIL${r}_ADDR=10.78.$r.$H"
    h=1
    addrs=
    while [ "$h" -le "$GDR_HOSTS" ]; do
        export "GDR_HOST${h}_RAIL${r}_ADDR=10.78.$r.$h"
        [ "$h" -eq "$H" ] || addrs="$addrs${addrs:+ }10.78.$r.$h"
        h=$((h + 1))
    done
    export "GDR_RAIL${r}_PEER_ADDRS=$addrs"
    r=$((r + 1))
done

# Every port ACTIVE with the RoCE v2 GID of its IPv4 address; export the index it has.
r=0
while [ "$r" -lt "$GDR_RAILS" ]; do
    port=/sys/class/infiniband/rxe$r/ports/1
    want=$(printf '0000:0000:0000:0000:0000:ffff:0a4e:%02x%02x' "$r" "$H")
    i=0
    idx=
    while :; do
        state=$(cat "$port/state" 2>/dev/null)
        case "$state" in
        *ACTIVE*)
            for g in "$port"/gids/*; do
                n=${g##*/}
                if [ "$(cat "$g" 2>/dev/null)" = "$want" ] &&
                    [ "$(cat "$port/gid_attrs/types/$n" 2>/dev/null)" = "RoCE v2" ]; then
                    idx=$n
                    break
                fi
            done
            ;;
        esac
        [ -n "$idx" ] && break
        i=$((i + 1))
        [ "$i" -le 300 ] || fail "rxe$r port 1 not ACTIVE with RoCE v2 GID $want after 30 s (state: $state)"
        sleep 0.1
    done
    export "GDR_RAIL${r}_GID_INDEX=$idx"
    r=$((r + 1))
done
# Rail 0 also under the single VM's names, so every device test and tool runs unchanged.
export GDR_TEST_DEVICE=rxe0 GDR_TEST_GID_INDEX="$GDR_RAIL0_GID_INDEX" GDR_TEST_ADDR="10.78.0.$H"

ulimit -l "$GDR_VM_MEMLOCK" || fail "cannot set ulimit -l $GDR_VM_MEMLOCK"
cd "$GDR_VM_CWD" || fail "cannot cd to $GDR_VM_CWD inside the VM"

# Fault watcher: runs the netem requests that any host's `gdr-fault` drops into our inbox.
mkdir -p "$R/inbox.host$H"
watch_faults() {
    while :; do
        for f in "$R/inbox.host$H"/*.req; do
            [ -f "$f" ] || continue
            set -- $(cat "$f")
            rm -f "$f"
            what=$1 rail=$2
            shift 2
            case "$what" in
            netem) out=$(tc qdisc replace dev "eth$rail" root netem "$@" 2>&1) ;;
            netem-clear) out=$(tc qdisc del dev "eth$rail" root 2>&1) ;;
            *) out="unknown request $what" && false ;;
            esac
            rc=$?
            msg="$(date -u +%H:%M:%S.%3N) host$H rail$rail $what $*"
            if [ "$rc" -eq 0 ]; then res=ok; else res="error: $out"; fi
            echo "gdr-fault: $msg: $res"
            echo "$msg: $res" >>"$R/faults.log"
            echo "$res" >"${f%.req}.tmp" && mv "${f%.req}.tmp" "${f%.req}.done"
        done
        sleep 0.2
    done
}
watch_faults </dev/null &
watcher=$!

# Barrier: every host's ports are up before any scenario starts.
touch "$R/ready.host$H"
i=0
while :; do
    n=0
    h=1
    while [ "$h" -le "$GDR_HOSTS" ]; do
        [ -f "$R/ready.host$h" ] && n=$((n + 1))
        h=$((h + 1))
    done
    [ "$n" -eq "$GDR_HOSTS" ] && break
    i=$((i + 1))
    [ "$i" -le $((GDR_CLUSTER_BARRIER * 10)) ] || fail "only $n of $GDR_HOSTS hosts ready after $GDR_CLUSTER_BARRIER s"
    sleep 0.1
done

echo "@@gdr-vm:$NONCE:start@@"
/bin/sh "$R/cmd.sh" </dev/null
rc=$?
kill "$watcher" 2>/dev/null
echo "$rc" >"$R/exit.host$H"
echo "@@gdr-vm:$NONCE:end:$rc@@"
