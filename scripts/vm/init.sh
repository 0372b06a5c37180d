#!/bin/bash
# PID 1 of the guest that scripts/smt-vm.sh boots: the root is the host's / (read-only, 9p). Mounts what a
# program needs, the writable shares, runs the command of the control share (/run/smt-vm, written by smt-vm.sh)
# with its output into that share, writes the exit code there, and powers the guest off (qemu runs -no-reboot:
# a reboot ends it; so does a panic, should this script die: panic=-1).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/shm /dev/pts 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/smt-vm
opts=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$opts" smtvmctl /run/smt-vm || { echo "smt-vm init: no control share" >/dev/console; echo b >/proc/sysrq-trigger; }
ctl=/run/smt-vm
# shellcheck source=/dev/null
. "$ctl/config"   # rw_paths=(...), workdir=..., envs=(...)
i=0
for p in "${rw_paths[@]}"; do
  # A path under /tmp or /run is hidden by the guest's own tmpfs above: make its
  # mount point there (elsewhere it exists already on the read-only root).
  [ -d "$p" ] || mkdir -p "$p" 2>/dev/null
  mount -t 9p -o "$opts" "smtvmrw$i" "$p" || echo "smt-vm init: cannot mount $p" >>"$ctl/stderr"
  i=$((i + 1))
done
ip link set lo up 2>/dev/null
hostname smt-vm 2>/dev/null
mkdir -p /tmp/home
cd "$workdir" || cd /
env -i PATH="$PATH" HOME=/tmp/home TERM=dumb LANG=C.UTF-8 SMT_VM=1 "${envs[@]}" \
  /bin/bash "$ctl/cmd" </dev/null >>"$ctl/stdout" 2>>"$ctl/stderr"
echo $? >"$ctl/rc.tmp"
mv "$ctl/rc.tmp" "$ctl/rc"
sync
echo b >/proc/sysrq-trigger
sleep 10
