#!/usr/bin/env bash
# Installs the Debian packages loom needs that are missing; idempotent, and quiet when all are present.
set -eu
pkgs="gcc make pkg-config libopenblas-dev libopenblas0-openmp libopenmpi-dev openmpi-bin iproute2 util-linux
      python3 python3-torch python3-numpy fortunes libjemalloc2"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "deps: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "deps: done"
