#!/usr/bin/env bash
# VFIO guest tests: boots a Debian kernel in QEMU (TCG) with an emulated
# Intel IOMMU and test devices, and runs the project's VFIO code and the
# erpc-vfio binding tool against the guest kernel's vfio-pci.
#
#   bash tools/vm/run.sh            # from the repository root (any cwd works)
#
# Steps: install missing Debian packages (qemu-system-x86, busybox-static,
# kmod, cpio; root only), fetch the current linux-image-*-cloud-amd64 .deb
# (cached in $ERPC_VM_CACHE, default ~/.cache/erpc-vm), build the static
# test binaries, pack an initramfs (busybox, VFIO and virtio modules, the
# binaries, /init), boot QEMU, and report the guest's `N passed, M failed`.
#
# Environment:
#   ERPC_VM_CACHE      download cache (kernel .deb and its unpacked tree)
#   CARGO_TARGET_DIR   the static build goes to $CARGO_TARGET_DIR/vm-static
#   ERPC_VM_TIMEOUT    seconds the guest may run (default 150)
#   ERPC_VM_KEEP=1     keep the scratch directory (initramfs root)
#
# The guest console (kernel, test output, QEMU's own messages) is written
# to $CARGO_TARGET_DIR/vm-static/console.log; on failure its tail is shown.
#
# Guest kernel: Debian's *cloud* flavour (27 MB), which has vfio-pci,
# vfio_iommu_type1 and virtio as modules and the Intel IOMMU built in. It has
# no e1000e driver, so "unbind restores the previous driver" is tested with
# a virtio-net-pci function (driver virtio-pci), and e1000e/edu are bound
# from and returned to "no driver". The generic flavour (70 MB) would add
# e1000e at three times the download.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${ERPC_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/erpc-vm}
target=${CARGO_TARGET_DIR:-$repo/target}
out=$target/vm-static
timeout_s=${ERPC_VM_TIMEOUT:-150}
log=$out/console.log
t0=$(date +%s%N)

phase() {
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '[vm %3d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"
}
die() { echo "vm: $*" >&2; exit 1; }

# ---------------------------------------------------------------- packages
need=(qemu-system-x86 busybox-static kmod cpio)
missing=()
for p in "${need[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "missing packages ${missing[*]}: install them with apt-get (needs root)"
  echo "vm: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi
phase "packages ok"

# ------------------------------------------------------------ guest kernel
mkdir -p "$cache" "$out"
# The meta package names the current ABI; old ABI packages leave the archive.
pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null \
      | awk '/Depends: linux-image-[0-9]/ {print $2; exit}' || true)
if [ -z "$pkg" ]; then
  apt-get update -qq 2>/dev/null || true
  pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null \
        | awk '/Depends: linux-image-[0-9]/ {print $2; exit}' || true)
fi
deb=""
if [ -n "$pkg" ]; then
  deb=$(ls -t "$cache/${pkg}"_*.deb 2>/dev/null | head -1 || true)
  if [ -z "$deb" ]; then
    echo "vm: downloading $pkg"
    (cd "$cache" && apt-get download -o APT::Sandbox::User=root "$pkg" >/dev/null) \
      || die "apt-get download $pkg failed"
    deb=$(ls -t "$cache/${pkg}"_*.deb | head -1)
  fi
else
  # No package index: use whatever is cached.
  deb=$(ls -t "$cache"/linux-image-*-cloud-amd64_*.deb 2>/dev/null | head -1 || true)
  [ -n "$deb" ] || die "cannot resolve linux-image-cloud-amd64 (run apt-get update) and nothing is cached in $cache"
fi
kroot=$cache/$(basename "$deb" .deb)
# Keep one kernel: drop the .debs and trees of older ABIs.
for old in "$cache"/linux-image-*; do
  case "$old" in "$deb" | "$kroot") ;; *) rm -rf "$old" ;; esac
done
if [ ! -f "$kroot/.ready" ]; then
  rm -rf "$kroot"; mkdir -p "$kroot"
  dpkg -x "$deb" "$kroot"
  kver=$(ls "$kroot/lib/modules" | head -1)
  depmod -b "$kroot" "$kver"
  touch "$kroot/.ready"
fi
kver=$(ls "$kroot/lib/modules" | head -1)
vmlinuz=$kroot/boot/vmlinuz-$kver
[ -f "$vmlinuz" ] || die "no kernel image in $deb"
phase "kernel $kver ($(basename "$deb"))"

# ------------------------------------------------------------ test binaries
# Static glibc binaries (static-pie): the initramfs has no libc. An explicit
# --target keeps RUSTFLAGS away from build scripts and proc macros. The
# release profile at opt-level 1 without debug info builds in less than half
# the time of the full one (this is test code) and keeps the initramfs small.
triple=x86_64-unknown-linux-gnu
(cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static -C strip=debuginfo" \
  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_DEBUG=0 \
  CARGO_TARGET_DIR="$out/target" \
  cargo build --release --locked --quiet --target "$triple" -p erpc-tools \
  --bin erpc-vfio --bin erpc-vfio-guest-test)
bins=$out/target/$triple/release
phase "static binaries built"

# --------------------------------------------------------------- initramfs
work=$(mktemp -d "${TMPDIR:-/tmp}/erpc-vm.XXXXXX")
cleanup() { if [ "${ERPC_VM_KEEP:-0}" = 1 ]; then echo "vm: kept $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT
root=$work/root
mkdir -p "$root"/{bin,sbin,proc,sys,dev,run,tmp,modules}
cp /bin/busybox "$root/bin/busybox"
cp "$bins/erpc-vfio" "$bins/erpc-vfio-guest-test" "$root/bin/"
# Module load order from the kernel's own dependency data.
: > "$root/modules/order"
for m in vfio-pci virtio_pci virtio_net; do
  modprobe -d "$kroot" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  name=$(basename "$ko")
  case "$name" in
    *.ko.xz) xz -dc "$ko" > "$root/modules/${name%.xz}"; name=${name%.xz} ;;
    *.ko.zst) zstd -qdc "$ko" > "$root/modules/${name%.zst}"; name=${name%.zst} ;;
    *) cp "$ko" "$root/modules/$name" ;;
  esac
  echo "$name" >> "$root/modules/order"
done
grep -q '^vfio-pci.ko$' "$root/modules/order" || die "vfio-pci.ko not found for $kver"
cat > "$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
while read -r m; do
  insmod "/modules/$m" || echo "init: insmod $m failed"
done < /modules/order
echo "=== guest: kernel $(uname -r), hugepages $(cat /proc/sys/vm/nr_hugepages)"
/bin/erpc-vfio-guest-test
echo "=== guest: test binary exited with $?"
poweroff -f
EOF
chmod 755 "$root/init"
initrd=$work/initrd.cpio
(cd "$root" && find . | cpio -o -H newc --quiet > "$initrd")
phase "initramfs $(du -h "$initrd" | cut -f1)"

# ------------------------------------------------------------------- guest
# intel-iommu must precede the PCI devices. e1000e and edu sit alone in
# their groups; virtio-net (on virtio-pci) carries the default route; the
# PCI-PCI bridge puts a second edu and a virtio-rng (on virtio-pci) in one
# group, which is not viable once the edu is bound to vfio-pci.
qemu=(qemu-system-x86_64 -accel tcg -cpu max -smp 1 -m 512
  -machine q35,kernel-irqchip=split -device intel-iommu,intremap=on
  -display none -vga none -monitor none -serial stdio -no-reboot
  -kernel "$vmlinuz" -initrd "$initrd"
  -append "console=ttyS0 intel_iommu=on panic=-1 quiet hugepages=16"
  -netdev user,id=n0,restrict=on -device e1000e,netdev=n0,mac=52:54:00:12:34:56,romfile=
  -device edu
  -netdev user,id=n1,restrict=on -device virtio-net-pci,netdev=n1,romfile=
  -device pci-bridge,id=br1,chassis_nr=1
  -device edu,bus=br1,addr=1
  -device virtio-rng-pci,bus=br1,addr=2)
phase "booting QEMU (log: $log)"
set +e
timeout "$timeout_s" "${qemu[@]}" < /dev/null > "$log" 2>&1
qrc=$?
set -e
phase "guest finished (qemu exit $qrc)"

# ------------------------------------------------------------------ report
tr -d '\r' < "$log" > "$log.tmp" && mv "$log.tmp" "$log"
grep -E '^(ok|not ok) - ' "$log" | sed 's/^/  /' || true
summary=$(grep -E '^guest: [0-9]+ passed, [0-9]+ failed$' "$log" | tail -1 || true)
if [ -z "$summary" ]; then
  [ "$qrc" = 124 ] && echo "vm: the guest did not finish within ${timeout_s}s"
  echo "vm: the guest printed no result; last 40 lines of $log:"
  tail -n 40 "$log"
  echo "vfio-guest: 0 passed, 1 failed"
  exit 1
fi
passed=$(echo "$summary" | sed -E 's/^guest: ([0-9]+) passed.*/\1/')
failed=$(echo "$summary" | sed -E 's/.* ([0-9]+) failed$/\1/')
if [ "$failed" != 0 ]; then
  echo "vm: failures; last 60 lines of $log:"
  tail -n 60 "$log"
fi
phase "done"
echo "vfio-guest: $passed passed, $failed failed"
[ "$failed" = 0 ]
