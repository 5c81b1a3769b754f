#!/usr/bin/env bash
# Fresh-machine check of the install steps (issue 12), for the case CI's machine does not show: a Debian 12 with
# neither node, npm nor Chromium. (The other case -- node and npm from nodesource, no Chromium -- is what a new
# machine of CI's kind is; `.ci/run` on one is that check.)
#
# What it does: debootstraps a minimal Debian 12 (`--variant=minbase`: no node, npm, Chromium, Vulkan, Python)
# under $CARGO_TARGET_DIR/fresh-root, puts a fresh clone of this checkout in it, and there, as a new machine would,
# runs the project's own install steps (tests/scripts/deps.sh: ensure_browser_deps, ensure_lavapipe) and then the
# whole browser suite (tests/browser/run.mjs) with the node, npm and Chromium they installed, against the CLI and
# the bundles built on this machine (test.sh must have run here first: same glibc, Debian 12 both).
# With POLICYPORT_FRESH_VENV=1 it also makes the torch venv there from Debian's python3 (ensure_venv: python3-venv
# from apt, then pip; ~5 GB more). Needs root (debootstrap, chroot, mounts).
# Usage: bash tests/scripts/fresh-check.sh [--keep]
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ "$(id -u)" = 0 ] || { echo "fresh-check.sh needs root (debootstrap, chroot)" >&2; exit 1; }
[ -x "$PP_BIN" ] && [ -f web/pkg/cpu/policyport_web.js ] && [ -f web/pkg/webgpu/policyport_web.js ] ||
  { echo "run tests/scripts/test.sh first (the CLI and both browser bundles are used as built here)" >&2; exit 1; }
FRESH="$CARGO_TARGET_DIR/fresh-root"
t0=$(date +%s)

command -v debootstrap >/dev/null || apt_install "a minimal Debian root for the fresh-machine check" debootstrap
if [ ! -x "$FRESH/bin/bash" ] || [ -e "$FRESH/usr/bin/node" ] || [ -e "$FRESH/usr/bin/chromium" ]; then
  echo "== debootstrap --variant=minbase bookworm $FRESH"
  grep -q " $FRESH/" /proc/mounts && { echo "mounts under $FRESH remain; not deleting it" >&2; exit 1; }
  rm -rf --one-file-system "$FRESH"
  debootstrap --variant=minbase bookworm "$FRESH" http://deb.debian.org/debian >"$CARGO_TARGET_DIR/debootstrap.log" 2>&1 ||
    { tail -20 "$CARGO_TARGET_DIR/debootstrap.log"; exit 1; }
fi
for tool in node npm chromium nodejs; do
  if chroot "$FRESH" sh -c "command -v $tool" >/dev/null; then
    echo "the fresh root already has $tool: not a fresh machine" >&2
    exit 1
  fi
done
# The machine's network setup, which a new machine of this kind has before anything is installed (not tools):
# name resolution, Debian's package sources (debootstrap knows only bookworm main; the machine also has -updates
# and -security, where the current Chromium is), apt's settings, and the CA bundle of the workplace's TLS proxy
# that npm and pip trust through NODE_EXTRA_CA_CERTS / SSL_CERT_FILE / npmrc.
cp /etc/resolv.conf "$FRESH/etc/resolv.conf"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  cp /etc/apt/sources.list.d/debian.sources "$FRESH/etc/apt/sources.list.d/" && rm -f "$FRESH/etc/apt/sources.list"
fi
cp /etc/apt/apt.conf.d/99* "$FRESH/etc/apt/apt.conf.d/" 2>/dev/null || true
# The proxy's CA bundle goes to a path Debian's ca-certificates does not manage (installing nodejs pulls that
# package, which rewrites /etc/ssl/certs/ca-certificates.crt without it), and every variable and npm's cafile
# point there.
ca_env=()
for var in NODE_EXTRA_CA_CERTS SSL_CERT_FILE; do
  f="${!var:-}"
  if [ -n "$f" ] && [ -f "$f" ]; then
    mkdir -p "$FRESH/pp/ca" && cp "$f" "$FRESH/pp/ca/bundle.crt"
    for v in NODE_EXTRA_CA_CERTS SSL_CERT_FILE PIP_CERT REQUESTS_CA_BUNDLE CURL_CA_BUNDLE; do
      ca_env+=("$v=/pp/ca/bundle.crt")
    done
    break
  fi
done
if [ -f /etc/npmrc ]; then
  if [ ${#ca_env[@]} != 0 ]; then
    sed 's|^cafile=.*|cafile=/pp/ca/bundle.crt|' /etc/npmrc > "$FRESH/etc/npmrc"
  else
    cp /etc/npmrc "$FRESH/etc/npmrc"
  fi
fi

# A fresh clone (no node_modules), plus what test.sh built here: the bundles, the CLI, and the venv the CLI's
# libtorch comes from (read-only).
rm -rf "$FRESH/repo" && git clone -q "$ROOT" "$FRESH/repo"
# The scripts as they are in this working tree (what is being checked may not be committed yet).
cp -r "$ROOT/tests/scripts/." "$FRESH/repo/tests/scripts/"
mkdir -p "$FRESH/repo/web/pkg" && cp -r web/pkg/cpu web/pkg/webgpu web/pkg/sizes.json "$FRESH/repo/web/pkg/"
mkdir -p "$FRESH/pp/bin" && cp "$PP_BIN" "$FRESH/pp/bin/policyport"
site=$("$PP_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# The CLI (built with tch) loads libtorch and the CUDA runtime wheels' libraries: the same dirs cli_env uses.
libpath="/pp/site/torch/lib"
for d in "$site"/nvidia/cu*/lib; do [ -d "$d" ] && libpath="$libpath:/pp/site/${d#"$site"/}"; done
mounts=()
mount_bind() { # mount_bind SRC DST [ro]
  mkdir -p "$FRESH$2"
  mount --bind "$1" "$FRESH$2"
  [ "${3:-}" != ro ] || mount -o remount,bind,ro "$FRESH$2"
  mounts=("$FRESH$2" "${mounts[@]}")
}
cleanup() { for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
mount_bind /proc /proc
mount_bind /dev /dev
mount_bind /sys /sys
mount_bind "$site" /pp/site ro

echo "== in the fresh root: the project's install steps, then the browser suite"
chroot "$FRESH" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  CARGO_TARGET_DIR=/pp/target LD_LIBRARY_PATH="$libpath" PP_FRESH_VENV="${POLICYPORT_FRESH_VENV:-0}" "${ca_env[@]}" \
  /bin/bash -c '
    set -euo pipefail
    cd /repo
    mkdir -p /pp/target
    ROOT=/repo
    source tests/scripts/deps.sh
    ensure_browser_deps
    ensure_lavapipe
    if [ "${PP_FRESH_VENV:-0}" = 1 ]; then
      command -v python3 >/dev/null ||
        apt_install "Python 3 (a stated prerequisite; a new machine of CI'"'"'s kind has one)" python3
      PP_VENV=/pp/venv
      ensure_venv
      /pp/venv/bin/python -c "import torch, onnx, onnxruntime; print(\"fresh root venv: torch\", torch.__version__)"
    fi
    deps_summary
    echo "fresh root: $(chromium --version | head -1); node $(node --version); npm $(npm --version)"
    node tests/browser/run.mjs /pp/bin/policyport /pp/target/browser
  ' 2>&1 | tee "$CARGO_TARGET_DIR/fresh-check.log"
echo "fresh-check.sh finished in $(( $(date +%s) - t0 )) s"
if [ "${1:-}" != --keep ]; then
  cleanup
  mounts=()
  # Never delete through a mount that is still there (/dev would go with it).
  if grep -q " $FRESH/" /proc/mounts; then
    echo "mounts under $FRESH remain; not deleting it" >&2
    exit 1
  fi
  rm -rf --one-file-system "$FRESH"
fi
