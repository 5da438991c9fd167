# Stage 2 of the gdr Soft-RoCE VM: runs as root inside the host's root (chroot, read-only 9p) with
# the host's own shell and tools. Brings up veth0 + rxe0, raises the locked-memory limit, and runs
# the command that the host wrote into the results share ($R/cmd.sh). Its exit code goes to
# $R/exit_code and, as a fallback, into the end marker on the console.
R=/run/gdr-vm/results
# GDR_VM_ADDR, GDR_VM_PREFIX, GDR_VM_MEMLOCK, GDR_VM_CWD, GDR_VM_NONCE, GDR_VM_TERM (not exported).
. "$R/env"

fail() {
    echo "gdr-vm: $*"
    exit 125
}

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM="$GDR_VM_TERM"
export GDR_TEST_DEVICE=rxe0 GDR_TEST_GID_INDEX=1 GDR_TEST_ADDR="$GDR_VM_ADDR" GDR_IN_VM=1
export GDR_VM_RESULTS="$R"

command -v ip >/dev/null && command -v rdma >/dev/null ||
    fail "ip/rdma (iproute2) missing on the host: run cargo xtask setup"
ip link set lo up
ip link add veth0 type veth peer name veth1 || fail "cannot create the veth pair"
ip addr add "$GDR_VM_ADDR/$GDR_VM_PREFIX" dev veth0 || fail "cannot address veth0"
ip link set veth1 up && ip link set veth0 up || fail "cannot bring veth0/veth1 up"
rdma link add rxe0 type rxe netdev veth0 || fail "rdma link add rxe0 failed"

# Wait until port 1 is ACTIVE and GID index 1 (RoCE v2, IPv4-mapped) is populated.
port=/sys/class/infiniband/rxe0/ports/1
i=0
while :; do
    state=$(cat "$port/state" 2>/dev/null)
    gid=$(cat "$port/gids/1" 2>/dev/null)
    case "$state" in
    *ACTIVE*)
        case "$gid" in
        "" | 0000:0000:0000:0000:0000:0000:0000:0000) ;;
        *) break ;;
        esac
        ;;
    esac
    i=$((i + 1))
    [ "$i" -le 300 ] || fail "rxe0 port 1 not ACTIVE with a GID at index 1 after 30 s (state: $state, gid 1: $gid)"
    sleep 0.1
done

ulimit -l "$GDR_VM_MEMLOCK" || fail "cannot set ulimit -l $GDR_VM_MEMLOCK"
cd "$GDR_VM_CWD" || fail "cannot cd to $GDR_VM_CWD inside the VM"

echo "@@gdr-vm:$GDR_VM_NONCE:start@@"
/bin/sh "$R/cmd.sh" </dev/null
rc=$?
echo "$rc" >"$R/exit_code"
echo "@@gdr-vm:$GDR_VM_NONCE:end:$rc@@"
