#!/usr/bin/env bash
# Debian packages the tests use: iproute2 and nftables for the kernel link backend (its tests
# run as root, in network namespaces), chromium (+ a font) for the browser test, driven by
# Playwright at /usr/bin/chromium, and OpenSSH's server for the SSH launcher's tests (tests/sshd.py).
# Installed only when running as root and missing; without root the kernel backend tests are
# skipped, and the browser and SSH tests fail saying what is missing.
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
[ -x /usr/bin/chromium ] || need+=(chromium fonts-liberation)
[ -x /usr/sbin/sshd ] && command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-server openssh-client)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_sysdeps: not root; skipping ${need[*]} (kernel backend tests will be skipped)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
