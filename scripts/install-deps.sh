#!/usr/bin/env bash
# Installs what lizard needs on a Debian 12 (bookworm) host, idempotently:
# Debian packages (debootstrap, networking tools, sqlite3, PostgreSQL 15
# for the store's and the end-to-end tests on PostgreSQL, Chromium for the
# browser test, a static busybox for the tests' OCI image, httpx for the
# Python SDK's end-to-end test, Node.js when it
# is missing) and runsc, the gVisor runtime, built from source with Go.
#
#   CACHE          where runsc builds and templates live (/var/cache/lizard)
#   RUNSC_VERSION  gvisor.dev/gvisor module version to build runsc from
#   RUNSC_LINK     where runsc is linked for PATH lookups (/usr/local/bin/runsc)
#   VERSITYGW_VERSION  the versitygw (S3 gateway for the object-store tests
#                  and `make cluster`) installed into $CACHE/tools/versitygw-<version>
set -euo pipefail

CACHE=${CACHE:-/var/cache/lizard}
RUNSC_VERSION=${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}
RUNSC_LINK=${RUNSC_LINK:-/usr/local/bin/runsc}
VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}

log() { printf '[deps] %s\n' "$*"; }
die() { printf '[deps] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (apt-get, debootstrap and runsc need it)"

mkdir -p "$CACHE"
# One `make deps` at a time.
exec 9>"$CACHE/.deps.lock"
flock 9

# ---- Debian packages ----
pkgs=(debootstrap iproute2 nftables iptables ca-certificates sqlite3 postgresql-15 chromium curl busybox-static tmux python3-httpx)
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)

missing=()
for p in "${pkgs[@]}"; do
	if ! dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii'; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	# Refresh the package lists only when an install needs them: when there
	# are none yet, or when the install fails with the lists there are.
	if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
		apt-get update -q
	fi
	if ! apt-get install -y -q --no-install-recommends "${missing[@]}"; then
		apt-get update -q
		apt-get install -y -q --no-install-recommends "${missing[@]}"
	fi
else
	log "Debian packages present"
fi

# ---- runsc ----
command -v go >/dev/null 2>&1 || die "Go is not in PATH (needed to build runsc and lizard)"

short=${RUNSC_VERSION##*-}
runsc="$CACHE/runsc-$short"
if [ -x "$runsc" ]; then
	log "runsc $short already built: $runsc"
else
	log "building runsc from gvisor.dev/gvisor@$RUNSC_VERSION (takes a few minutes)"
	mkdir -p "$CACHE/gobuild"
	work=$(mktemp -d "$CACHE/gobuild/runsc.XXXXXX")
	trap 'rm -rf "$work" "$runsc.tmp"' EXIT
	(
		cd "$work"
		go mod init runscbuild >/dev/null 2>&1
		GOFLAGS=-mod=mod go get "gvisor.dev/gvisor@$RUNSC_VERSION"
		CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags='-s -w' -o "$runsc.tmp" gvisor.dev/gvisor/runsc
	)
	mv -f "$runsc.tmp" "$runsc"
	rm -rf "$work"
	trap - EXIT
	log "built $runsc"
fi

if [ "$(readlink -- "$RUNSC_LINK" 2>/dev/null || true)" != "$runsc" ]; then
	mkdir -p "$(dirname -- "$RUNSC_LINK")"
	ln -sfn -- "$runsc" "$RUNSC_LINK"
	log "linked $RUNSC_LINK -> $runsc"
fi
log "runsc: $("$RUNSC_LINK" --version 2>/dev/null | head -n1 || echo '?')"

# ---- versitygw ----
# An S3-compatible gateway (POSIX backend) that the object-store tests
# start on loopback (internal/objstore/vgwtest); built once per version.
vgw="$CACHE/tools/versitygw-$VERSITYGW_VERSION/versitygw"
if [ -x "$vgw" ]; then
	log "versitygw $VERSITYGW_VERSION already installed: $vgw"
else
	log "installing versitygw $VERSITYGW_VERSION"
	mkdir -p "$(dirname -- "$vgw")"
	GOBIN="$(dirname -- "$vgw")" CGO_ENABLED=0 go install -trimpath "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
	log "installed $vgw"
fi
