#!/bin/busybox sh
# Stage 1 of the gdr Soft-RoCE VM: PID 1 inside the initramfs that `cargo xtask` builds (see
# xtask/src/vm.rs). Loads the modules, mounts the host's root read-only over 9p, mounts fresh
# proc/sys/dev/tmp/run inside it plus the writable per-run results share, and chroots into the host
# root to run stage 2 (stage2.sh). Editing this file or stage2.sh changes the initramfs cache key.
/bin/busybox mkdir -p /bin /proc /sys /dev /host
/bin/busybox --install -s /bin
export PATH=/bin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

die() {
    echo "gdr-vm: $*"
    sync
    poweroff -f
    exit 1
}

# One module name a line, in load order (the kernel has no modprobe here and needs none).
while read -r m; do
    insmod "/modules/$m.ko" || die "insmod $m failed"
done </modules.list

p9='trans=virtio,version=9p2000.L,msize=512000'
mount -t 9p -o "$p9,ro,cache=loose" hostroot /host || die "cannot mount the host root over 9p"
for d in proc sys dev tmp run; do
    [ -d "/host/$d" ] || die "the host root has no /$d"
done
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /host/dev/shm
mount -t tmpfs -o mode=1777 tmpfs /host/tmp
mount -t tmpfs -o mode=755 tmpfs /host/run
mkdir -p /host/run/gdr-vm/results
mount -t 9p -o "$p9,rw" results /host/run/gdr-vm/results || die "cannot mount the results share"
# gdr.stage2=cluster on the kernel command line: a cluster host (cluster.sh) instead of the VM.
stage2=stage2.sh
case " $(cat /proc/cmdline) " in
*" gdr.stage2=cluster "*) stage2=cluster.sh ;;
esac
cp "/$stage2" /host/run/gdr-vm/stage2.sh

chroot /host /bin/sh /run/gdr-vm/stage2.sh
sync
poweroff -f
