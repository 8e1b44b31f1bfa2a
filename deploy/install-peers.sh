#!/usr/bin/env bash
# Installs the real third-party peers the end-to-end tests use (see docs/testing.md).
# Where apt is missing or we are not root, it says what is missing; the tests that need a missing
# peer then skip with that reason -- except under CI=true, where a missing peer fails the run.
set -uo pipefail

declare -A PKG=(
  [baresip]="baresip baresip-core libspandsp2"  # libspandsp2: baresip's g722 module, and the G.722 peer of tests/telcodecs
  [kamailio]="kamailio"
  [redis-server]="redis-server"
  [espeak-ng]="espeak-ng libespeak-ng1"  # libespeak-ng1: the local TTS helper (gateway/providers/pipeline/local)
  [sox]="sox libsox-fmt-all"
  [chromium]="chromium chromium-driver"
  [ip]="iproute2"
  [unshare]="util-linux"
  [gcc]="gcc libc6-dev"
  [docker-compose]="docker-compose"
  [pg_ctl]="postgresql"  # the database of calls' PostgreSQL tests (tests/support/postgres.py)
  [svmap]="sipvicious"  # the scanners the SIP edge is tested against (tests/e2e/test_sip_edge.py)
  [fail2ban-regex]="fail2ban"  # proves deploy/fail2ban's filter reads the gateway's security log lines
)

# Debian keeps PostgreSQL's server programs off PATH, in /usr/lib/postgresql/<version>/bin.
have() {
  if [ "$1" = pg_ctl ]; then
    compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null
  else
    command -v "$1" >/dev/null 2>&1
  fi
}

missing=()
for bin in "${!PKG[@]}"; do
  have "$bin" || missing+=("$bin")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-peers: all system peers present"
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  pkgs=()
  for bin in "${missing[@]}"; do pkgs+=(${PKG[$bin]}); done
  echo "install-peers: installing ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
else
  echo "install-peers: not root or no apt-get; missing: ${missing[*]} (tests needing them will skip)"
fi

still=()
for bin in "${missing[@]}"; do
  have "$bin" || still+=("$bin")
done
if [ ${#still[@]} -gt 0 ]; then
  echo "install-peers: still missing: ${still[*]}"
  if [ "${CI:-}" = "true" ]; then
    echo "install-peers: CI=true and a system peer is missing: failing" >&2
    exit 1
  fi
fi
exit 0
