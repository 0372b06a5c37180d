#!/usr/bin/env bash
# Runs a command inside a QEMU guest whose CPUs are SMT siblings and whose kernel has CONFIG_SCHED_CORE.
#
#   scripts/smt-vm.sh [options] -- COMMAND [ARG...]
#
# The guest's root filesystem is this machine's / (read-only, over virtio 9p) and the project directory is shared
# writable at the same path, so programs built here run there unchanged and what they write stays. COMMAND runs as
# root in the current directory (the project directory if the current one is not visible in the guest); its
# stdout and stderr come back here as they are written, and its exit code becomes this script's.
#
# The guest kernel is linux-source-6.1 built once from `make tinyconfig` plus scripts/vm/kernel.config (about
# 6 minutes on 2 CPUs), cached as build/vm/bzImage-6.1-HASH where HASH is that of the fragment: a changed fragment
# builds a new one. A kernel is also looked for (and, once built, copied to) $CORESCHED_VM_CACHE (default
# /var/cache/coresched-vm/) so another clone, or CI, reuses it; $CORESCHED_VM_KERNEL names a bzImage to use as is.
#
# Exit codes: COMMAND's; 124 when --timeout killed the guest; 125 when the guest did not run COMMAND (boot failure:
# the console log is printed); 3 when qemu or the kernel (and what building it needs) is missing; 2 on bad usage.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
project=$(cd "$here/.." && pwd)
fragment=$here/vm/kernel.config
init_script=$here/vm/init.sh
recipe=1   # bump when the way the kernel is built changes (part of the cache key)

cores=1 threads=2 mem=1G timeout=600 accel=auto verbose=0 action=run
rw_dirs=() envs=()

usage() {
  cat <<EOF
usage: scripts/smt-vm.sh [options] -- COMMAND [ARG...]
Runs COMMAND as root inside a QEMU guest with SMT siblings and a CONFIG_SCHED_CORE kernel.
  --cores N          cores in the guest's one package (default $cores)
  --threads 2|4      hardware threads per core (default $threads)
  --mem SIZE         guest memory, as qemu's -m takes it (default $mem)
  --timeout SECONDS  kill the guest after this long, exit 124 (default $timeout; 0: no limit)
  --accel auto|kvm|tcg
                     auto (default) uses KVM when /dev/kvm boots a guest here, TCG otherwise
  --rw DIR           share DIR writable too (the project directory always is); repeatable
  --env NAME=VALUE   set in COMMAND's environment; repeatable
  -v, --verbose      show the guest's console (kernel messages) on stderr
  --kernel           only build or find the guest kernel and print its path
  --check            exit 0 if a guest can run here (qemu present, kernel cached or buildable), else say why, exit 3
  -h, --help         this text
Environment: CORESCHED_VM_KERNEL (a bzImage to use), CORESCHED_VM_CACHE (default /var/cache/coresched-vm),
CORESCHED_VM_JOBS (make -j for the kernel build, default 2), CORESCHED_VM_QEMU (default qemu-system-x86_64).
Install qemu and the kernel build's dependencies with: scripts/deps.sh --vm
EOF
}

say() { echo "[smt-vm] $*" >&2; }
die() { say "$1"; exit "${2:-2}"; }

while (($#)); do
  case "$1" in
    --cores) cores=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    --mem) mem=${2:?}; shift 2 ;;
    --timeout) timeout=${2:?}; shift 2 ;;
    --accel) accel=${2:?}; shift 2 ;;
    --rw) rw_dirs+=("$(cd "${2:?}" && pwd)"); shift 2 ;;
    --env) [[ ${2:-} == [A-Za-z_]*=* ]] || die "--env wants NAME=VALUE"; envs+=("$2"); shift 2 ;;
    -v|--verbose) verbose=1; shift ;;
    --kernel) action=kernel; shift ;;
    --check) action=check; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) usage >&2; exit 2 ;;
  esac
done
[[ $cores =~ ^[1-9][0-9]*$ ]] || die "--cores wants a positive number"
[[ $threads == 2 || $threads == 4 ]] || die "--threads wants 2 or 4"
((cores * threads <= 64)) || die "at most 64 CPUs (the guest kernel's NR_CPUS)"
[[ $timeout =~ ^[0-9]+$ ]] || die "--timeout wants seconds"
[[ $accel == auto || $accel == kvm || $accel == tcg ]] || die "--accel wants auto, kvm or tcg"
if [[ $action == run ]] && (($# == 0)); then usage >&2; exit 2; fi

# ---------------------------------------------------------------------------------------------- the guest kernel
key=$( { echo "recipe $recipe"; cat "$fragment"; } | sha256sum | cut -c1-16)
kname=bzImage-6.1-$key
vmdir=$project/build/vm
cache_dir=${CORESCHED_VM_CACHE-/var/cache/coresched-vm}
src_tar=/usr/src/linux-source-6.1.tar.xz
build_tools=(make gcc flex bison bc cpio xz perl)

find_kernel() {   # prints the path of a usable kernel, or nothing
  if [[ -n ${CORESCHED_VM_KERNEL:-} ]]; then
    [[ -r $CORESCHED_VM_KERNEL ]] || die "CORESCHED_VM_KERNEL=$CORESCHED_VM_KERNEL is not readable" 3
    echo "$CORESCHED_VM_KERNEL"; return
  fi
  local c
  for c in "$vmdir/$kname" ${cache_dir:+"$cache_dir/$kname"}; do
    [[ -r $c ]] && { echo "$c"; return; }
  done
  return 0
}

missing_build_deps() {   # prints what building the kernel lacks
  local t
  [[ -r $src_tar ]] || echo "linux-source-6.1 ($src_tar)"
  for t in "${build_tools[@]}"; do command -v "$t" >/dev/null || echo "$t"; done
  [[ -r /usr/include/gelf.h ]] || echo "libelf-dev"
}

build_kernel() {
  local missing
  missing=$(missing_build_deps | paste -sd' ')
  [[ -z $missing ]] || die "cannot build the guest kernel, missing: $missing (install them with: scripts/deps.sh --vm)" 3
  mkdir -p "$vmdir"
  local src=$vmdir/linux-source-6.1 obj=$vmdir/obj-$key log=$vmdir/build-$key.log t0=$SECONDS
  local jobs=${CORESCHED_VM_JOBS:-2}
  say "building the guest kernel $kname (linux-source-6.1, tinyconfig + scripts/vm/kernel.config," \
      "nice -n 10 make -j$jobs: about 6 minutes on 2 CPUs; log: $log)"
  if [[ ! -e $src/.extracted ]]; then
    say "extracting $src_tar"
    rm -rf "$src"; mkdir -p "$src"
    tar -xJf "$src_tar" -C "$src" --strip-components=1
    touch "$src/.extracted"
  fi
  rm -rf "$obj"; mkdir -p "$obj"
  local mk=(nice -n 10 make -C "$src" O="$obj" ARCH=x86_64)
  {
    "${mk[@]}" tinyconfig
    "$src/scripts/kconfig/merge_config.sh" -m -O "$obj" "$obj/.config" "$fragment"
    "${mk[@]}" olddefconfig
  } >"$log" 2>&1 || { tail -n 30 "$log" >&2; die "kernel configuration failed (log: $log)" 3; }
  # Every option the fragment asks for must have survived the merge (a missing dependency drops it silently).
  local want dropped=()
  while IFS= read -r want; do
    grep -qxF "$want" "$obj/.config" || dropped+=("$want")
  done < <(grep -E '^CONFIG_[A-Z0-9_]+=' "$fragment")
  ((${#dropped[@]} == 0)) || die "the kernel configuration dropped: ${dropped[*]} (see $obj/.config)" 3
  say "configured; compiling"
  "${mk[@]}" -j"$jobs" bzImage >>"$log" 2>&1 || { tail -n 30 "$log" >&2; die "kernel build failed (log: $log)" 3; }
  cp "$obj/arch/x86/boot/bzImage" "$vmdir/$kname.tmp" && mv "$vmdir/$kname.tmp" "$vmdir/$kname"
  cp "$obj/.config" "$vmdir/$kname.config"
  rm -rf "$obj"
  say "guest kernel built in $((SECONDS - t0)) s: $vmdir/$kname"
  if [[ -n $cache_dir ]] && mkdir -p "$cache_dir" 2>/dev/null && [[ -w $cache_dir ]]; then
    cp "$vmdir/$kname" "$cache_dir/$kname.tmp.$$" && mv "$cache_dir/$kname.tmp.$$" "$cache_dir/$kname" &&
      say "copied to $cache_dir/$kname for other clones"
  fi
}

kernel_path() {   # finds or builds the kernel, one builder at a time
  local k
  k=$(find_kernel)
  if [[ -z $k ]]; then
    mkdir -p "$vmdir"
    exec 9>"$vmdir/.lock"
    if ! flock -n 9; then say "another smt-vm.sh is building the guest kernel; waiting"; flock 9; fi
    k=$(find_kernel)
    [[ -n $k ]] || { build_kernel; k=$vmdir/$kname; }
    exec 9>&-
  fi
  echo "$k"
}

qemu=${CORESCHED_VM_QEMU:-qemu-system-x86_64}
have_qemu() { command -v "$qemu" >/dev/null; }

if [[ $action == check ]]; then
  have_qemu || die "$qemu not found (install it with: scripts/deps.sh --vm)" 3
  k=$(find_kernel)
  if [[ -n $k ]]; then say "ready: qemu and the guest kernel $k"; exit 0; fi
  missing=$(missing_build_deps | paste -sd' ')
  [[ -z $missing ]] || die "no guest kernel cached ($vmdir/$kname, $cache_dir/$kname) and cannot build one, missing: $missing (install them with: scripts/deps.sh --vm)" 3
  say "ready: qemu present; the guest kernel will be built on first use (about 6 minutes)"
  exit 0
fi
if [[ $action == kernel ]]; then kernel_path; exit 0; fi

have_qemu || die "$qemu not found (install it with: scripts/deps.sh --vm)" 3
kernel=$(kernel_path)

# ---------------------------------------------------------------------------------------------- the guest
ctl=$(mktemp -d "${TMPDIR:-/tmp}/smt-vm.XXXXXX")
qpid=""
tail_pids=()
cleanup() {
  [[ -n $qpid ]] && kill -KILL "$qpid" 2>/dev/null
  ((${#tail_pids[@]})) && kill "${tail_pids[@]}" 2>/dev/null
  rm -rf "$ctl"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The working directory: the current one when the guest sees it as it is (the project, a --rw folder, or anything
# outside /tmp, /run, /dev, /proc, /sys, which the guest mounts anew), else the project directory.
workdir=$PWD
case "$workdir/" in
  "$project"/*) ;;
  /tmp/*|/run/*|/dev/*|/proc/*|/sys/*)
    inside=0
    for d in "${rw_dirs[@]}"; do [[ $workdir/ == "$d"/* ]] && inside=1; done
    ((inside)) || { say "the current directory is not visible in the guest; running in $project"; workdir=$project; }
    ;;
esac

{
  printf 'rw_paths=('; printf '%q ' "$project" "${rw_dirs[@]}"; printf ')\n'
  printf 'workdir=%q\n' "$workdir"
  printf 'envs=('; ((${#envs[@]})) && printf '%q ' "${envs[@]}"; printf ')\n'
} >"$ctl/config"
{ printf 'exec'; printf ' %q' "$@"; printf '\n'; } >"$ctl/cmd"
: >"$ctl/stdout"; : >"$ctl/stderr"

# KVM when it works: /dev/kvm may be there and still not run this guest (nested KVM here: qemu's CPU models need
# MSRs it lacks), so boot the kernel under KVM for a moment and look for its banner on the console. The answer is
# kept for the rest of this host boot (build/vm/kvm-probe).
use_kvm=0
if [[ $accel != tcg ]]; then
  probe_key="$(cat /proc/sys/kernel/random/boot_id 2>/dev/null) $kernel"
  probe_file=$vmdir/kvm-probe
  if [[ -r $probe_file && $(head -n 1 "$probe_file") == "$probe_key" ]]; then
    use_kvm=$(sed -n 2p "$probe_file")
  elif [[ -r /dev/kvm && -w /dev/kvm ]]; then
    say "trying KVM"
    timeout 10 "$qemu" -accel kvm -cpu Skylake-Server -smp 2,sockets=1,cores=1,threads=2 -m 128M \
      -nodefaults -no-user-config -display none -no-reboot -nic none -serial "file:$ctl/kvm-probe.console" \
      -kernel "$kernel" -append "console=ttyS0 panic=-1 root=/dev/none" </dev/null >"$ctl/kvm-probe" 2>&1 || true
    grep -q "Linux version" "$ctl/kvm-probe.console" 2>/dev/null && use_kvm=1
    mkdir -p "$vmdir" && printf '%s\n%s\n' "$probe_key" "$use_kvm" >"$probe_file" 2>/dev/null || true
  fi
if ((use_kvm == 0)) && [[ $accel == kvm ]]; then
    cat "$ctl/kvm-probe" >&2 2>/dev/null; die "--accel kvm: KVM does not start a guest here" 3
  fi
fi
if ((use_kvm)); then
  accel_args=(-accel kvm -cpu Skylake-Server); accel_name=KVM
else
  accel_args=(-accel tcg,thread=multi -cpu Skylake-Server); accel_name="TCG (emulation; KVM not usable here)"
  [[ $accel == tcg ]] && accel_name="TCG (emulation)"
fi

for d in "$project" "${rw_dirs[@]}" "$ctl" "$init_script"; do
  [[ $d != *,* && $d != *" "* ]] || die "cannot share a path with a comma or a space over 9p: $d"
done
ncpu=$((cores * threads))
msize=262144
shares=(-fsdev "local,id=fsroot,path=/,security_model=none,readonly=on,multidevs=remap"
        -device "virtio-9p-pci,fsdev=fsroot,mount_tag=smtvmroot"
        -fsdev "local,id=fsctl,path=$ctl,security_model=none"
        -device "virtio-9p-pci,fsdev=fsctl,mount_tag=smtvmctl")
i=0
for d in "$project" "${rw_dirs[@]}"; do
  shares+=(-fsdev "local,id=fsrw$i,path=$d,security_model=none,multidevs=remap"
           -device "virtio-9p-pci,fsdev=fsrw$i,mount_tag=smtvmrw$i")
  i=$((i + 1))
done
append="console=ttyS0 root=smtvmroot rootfstype=9p rootflags=trans=virtio,version=9p2000.L,msize=$msize,cache=loose"
append+=" ro init=$init_script panic=-1 schedstats=enable random.trust_cpu=on loglevel=4"

say "booting $ncpu CPUs (1 socket x $cores cores x $threads threads, Skylake-Server) with $accel_name," \
    "$mem memory, kernel $kernel"
t0=$SECONDS
console=$ctl/console.log
"$qemu" "${accel_args[@]}" -smp "$ncpu,sockets=1,cores=$cores,threads=$threads" -m "$mem" \
  -nodefaults -no-user-config -display none -no-reboot -nic none \
  -device virtio-rng-pci -serial "file:$console" "${shares[@]}" \
  -kernel "$kernel" -append "$append" </dev/null >"$ctl/qemu.log" 2>&1 &
qpid=$!
if ((verbose)); then tail -n +1 -F --pid="$qpid" "$console" >&2 2>/dev/null & tail_pids+=($!); fi
tail -n +1 -F --pid="$qpid" "$ctl/stdout" 2>/dev/null & tail_pids+=($!)
tail -n +1 -F --pid="$qpid" "$ctl/stderr" >&2 2>/dev/null & tail_pids+=($!)

timed_out=0
if ((timeout > 0)); then
  deadline=$((SECONDS + timeout))
  while kill -0 "$qpid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then timed_out=1; kill -KILL "$qpid" 2>/dev/null; break; fi
    sleep 0.2
  done
fi
wait "$qpid" 2>/dev/null || true
qpid=""
wait "${tail_pids[@]}" 2>/dev/null || true
tail_pids=()

if ((timed_out)); then
  say "timed out after $timeout s: guest killed (last console lines follow)"
  tail -n 15 "$console" >&2 || true
  exit 124
fi
if [[ ! -s $ctl/rc ]]; then
  say "the guest stopped without running the command to its end; qemu said:"
  cat "$ctl/qemu.log" >&2
  say "console:"
  tail -n 40 "$console" >&2 || true
  exit 125
fi
rc=$(cat "$ctl/rc")
say "guest done in $((SECONDS - t0)) s ($accel_name), exit code $rc"
exit "$rc"
