#!/usr/bin/env bash
# A lizard cluster on this machine: PostgreSQL and three nodes, each in a
# network namespace of its own (docs/CLUSTER.md).
#
#   scripts/cluster.sh up [-d]   start it (make cluster); in the foreground
#                                until Ctrl-C, which stops and cleans it all;
#                                -d returns once it is up
#   scripts/cluster.sh down      stop it and clean everything (make cluster-down)
#
# Layout (each a variable below; defaults in brackets):
#   - a host bridge $LIZARD_CLUSTER_BRIDGE [lzc0] with $NET.1/24
#     ($LIZARD_CLUSTER_NET [10.77.0]);
#   - PostgreSQL 15 (Debian's, installed by make deps) in $DIR/pg, listening
#     on $NET.1:$LIZARD_CLUSTER_PG_PORT [55432] only, a password login for
#     that subnet only;
#   - the object store: versitygw ($VERSITYGW, installed by make deps) on
#     $DIR/s3, listening on $NET.1:$LIZARD_CLUSTER_S3_PORT [55433] only,
#     bucket lizard, keys of this run; every node gets --object-store
#     (durable pauses and snapshots, resume anywhere, drain --move);
#   - per node N of $LIZARD_CLUSTER_NODES [a b c] (the i-th): network
#     namespace <netns>-N ($LIZARD_CLUSTER_NETNS [lzc]) joined to the bridge
#     at $NET.(10+i), and in it `lizard serve` with the API on :8080, the
#     preview proxy on :8081, the internal listener on :7070, its own data
#     dir ($DIR/nodes/N), cgroup parent <cgroup>-N ($LIZARD_CLUSTER_CGROUP
#     [lizard]), sandbox bridge and subnet (10.(80+i).0.0/16 with
#     $LIZARD_CLUSTER_SUBNET_BASE [80]) and build bridge and subnet
#     (10.(90+i).0.0/16).
# State lives in $LIZARD_CLUSTER_DIR [/var/lib/lizard-cluster]; each run
# starts clean. Nothing is installed here: make cluster runs make deps,
# build and templates first.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."

DIR=${LIZARD_CLUSTER_DIR:-/var/lib/lizard-cluster}
LIZARD=${LIZARD_BIN:-$PWD/bin/lizard}
TEMPLATE_DIR=${TEMPLATE_DIR:-/var/cache/lizard/templates}
RUNSC=${RUNSC:-}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
VERSITYGW=${VERSITYGW:-}

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] error: %s\n' "$*" >&2; exit 1; }

# config sets the layout from the environment, or, for down, from the
# state of the run that is up (so that down cleans what up made).
config() {
	if [ "${1:-}" = saved ] && [ -f "$DIR/cluster.env" ]; then
		# shellcheck source=/dev/null
		. "$DIR/cluster.env"
	fi
	BRIDGE=${BRIDGE:-${LIZARD_CLUSTER_BRIDGE:-lzc0}}
	NET=${NET:-${LIZARD_CLUSTER_NET:-10.77.0}}
	NODES=${NODES:-${LIZARD_CLUSTER_NODES:-a b c}}
	NETNS=${NETNS:-${LIZARD_CLUSTER_NETNS:-lzc}}
	CGROUP=${CGROUP:-${LIZARD_CLUSTER_CGROUP:-lizard}}
	PG_PORT=${PG_PORT:-${LIZARD_CLUSTER_PG_PORT:-55432}}
	S3_PORT=${S3_PORT:-${LIZARD_CLUSTER_S3_PORT:-55433}}
	SUBNET_BASE=${SUBNET_BASE:-${LIZARD_CLUSTER_SUBNET_BASE:-80}}
}

# Per node i (1-based) named n.
# bridge_mac is a locally administered MAC derived from the bridge's name.
bridge_mac() { printf '02:%s' "$(printf 'lizard bridge %s' "$1" | sha256sum | cut -c1-10 | sed 's/../&:/g; s/:$//')"; }
node_addr() { echo "$NET.$((10 + $1))"; }
node_ns() { echo "$NETNS-$1"; }
node_veth() { echo "${NETNS}h-$1"; }
node_dir() { echo "$DIR/nodes/$1"; }
node_cgroup() { echo "$CGROUP-$1"; }
# runsc's state directory of a data dir, as gvisor.RunscRootFor makes it.
runsc_root() { printf '/run/lizard/runsc-%s' "$(printf '%s' "$1" | sha256sum | cut -c1-12)"; }

save_config() {
	cat >"$DIR/cluster.env" <<EOF
BRIDGE='$BRIDGE' NET='$NET' NODES='$NODES' NETNS='$NETNS' CGROUP='$CGROUP' PG_PORT='$PG_PORT' SUBNET_BASE='$SUBNET_BASE' S3_PORT='$S3_PORT'
EOF
}

check_config() {
	[ "$(id -u)" = 0 ] || die "run as root (network namespaces, cgroups, gVisor)"
	[ -x "$LIZARD" ] || die "$LIZARD not built (make build)"
	[ -x "$PGBIN/initdb" ] || die "PostgreSQL 15 is not installed in $PGBIN (make deps)"
	[ -x "$VERSITYGW" ] || die "versitygw is not installed (VERSITYGW=$VERSITYGW; make deps)"
	[ -f "$TEMPLATE_DIR/base/template.json" ] || die "the base template is not built in $TEMPLATE_DIR (make templates)"
	[[ $NET =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "LIZARD_CLUSTER_NET=$NET: want the first three numbers of a /24, e.g. 10.77.0"
	[ ${#BRIDGE} -le 15 ] || die "LIZARD_CLUSTER_BRIDGE=$BRIDGE: at most 15 characters"
	local n i=0
	for n in $NODES; do
		i=$((i + 1))
		[[ $n =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "node name $n: want a lowercase letter then up to 7 letters or digits"
		[ ${#NETNS} -le 7 ] || die "LIZARD_CLUSTER_NETNS=$NETNS: at most 7 characters (interface names)"
	done
	[ "$i" -ge 1 ] && [ "$i" -le 9 ] || die "LIZARD_CLUSTER_NODES: 1 to 9 nodes"
}

# random_hex n prints n random bytes in hex.
random_hex() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }

pg() { runuser -u postgres -- "$PGBIN/$1" "${@:2}"; }

start_postgres() {
	local pgdata=$DIR/pg password=$1
	mkdir -p "$pgdata" "$DIR/pg-run" "$DIR/pg-log"
	chown postgres: "$pgdata" "$DIR/pg-run" "$DIR/pg-log"
	chmod 700 "$pgdata" "$DIR/pg-run" "$DIR/pg-log"
	pg initdb -D "$pgdata" -U postgres -A trust --no-sync >"$DIR/pg-init.log" 2>&1 || { cat "$DIR/pg-init.log" >&2; die "initdb failed"; }
	cat >>"$pgdata/postgresql.conf" <<EOF
listen_addresses = '$NET.1'
port = $PG_PORT
unix_socket_directories = '$DIR/pg-run'
max_connections = 200
fsync = off
EOF
	# The socket (root and postgres only: its directory is 0700) trusts;
	# TCP takes the password, from the cluster's subnet only.
	cat >"$pgdata/pg_hba.conf" <<EOF
local all all trust
host lizard lizard $NET.0/24 scram-sha-256
host lizard lizard samehost scram-sha-256
EOF
	pg pg_ctl -D "$pgdata" -l "$DIR/pg-log/postgres.log" -w -t 60 start >/dev/null || { tail -20 "$DIR/pg-log/postgres.log" >&2; die "PostgreSQL did not start"; }
	pg psql -q -h "$DIR/pg-run" -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 \
		-c "CREATE ROLE lizard LOGIN PASSWORD '$password'" -c "CREATE DATABASE lizard OWNER lizard" >/dev/null
}

# start_objstore starts versitygw on $DIR/s3 at $NET.1:$S3_PORT with this
# run's keys, and makes the bucket.
start_objstore() {
	mkdir -p "$DIR/s3/data" "$DIR/s3/meta"
	ROOT_ACCESS_KEY_ID=$S3_KEY ROOT_SECRET_ACCESS_KEY=$S3_SECRET setsid "$VERSITYGW" --port "$NET.1:$S3_PORT" \
		--region us-east-1 --quiet posix --sidecar "$DIR/s3/meta" "$DIR/s3/data" >"$DIR/s3/log" 2>&1 </dev/null &
	echo $! >"$DIR/s3/pid"
	for _ in $(seq 1 100); do
		if curl -fsS -o /dev/null --max-time 2 -X PUT -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" --aws-sigv4 aws:amz:us-east-1:s3 --user "$S3_KEY:$S3_SECRET" \
			"http://$NET.1:$S3_PORT/lizard" 2>/dev/null; then
			return 0
		fi
		kill -0 "$(cat "$DIR/s3/pid")" 2>/dev/null || { tail -20 "$DIR/s3/log" >&2; die "versitygw exited"; }
		sleep 0.2
	done
	tail -20 "$DIR/s3/log" >&2
	die "versitygw did not make the bucket within 20 s"
}

# start_node i n: starts node n (the i-th) in its namespace, detached from
# this script's session so that a Ctrl-C reaches only the script, which
# then stops everything in order.
start_node() {
	local i=$1 n=$2 addr dir
	addr=$(node_addr "$i")
	dir=$(node_dir "$n")
	mkdir -p "$dir"
	local args=(serve --listen "$addr:8080" --proxy-listen "$addr:8081"
		--internal-listen "$addr:7070" --advertise "$addr:7070" --node-name "$n"
		--database "$DATABASE" --cluster-secret-file "$DIR/secret"
		--data-dir "$dir/data" --template-dir "$TEMPLATE_DIR" --cgroup-parent "$(node_cgroup "$n")"
		--bridge "lzsb-$n" --subnet "10.$((SUBNET_BASE + i)).0.0/16"
		--build-bridge "lzbb-$n" --build-subnet "10.$((SUBNET_BASE + 10 + i)).0.0/16"
		--object-store "s3://lizard?endpoint=$NET.1:$S3_PORT&region=us-east-1&insecure=true")
	[ -n "$RUNSC" ] && args+=(--runsc "$RUNSC")
	# nsenter joins only the network namespace: the node's mounts (its
	# sandboxes' namespaces, volumes) are the host's, so a restarted node
	# finds them (ip netns exec would give it a mount namespace of its own).
	LIZARD_API_KEY=$API_KEY AWS_ACCESS_KEY_ID=$S3_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET setsid nsenter --net="/run/netns/$(node_ns "$n")" -- "$LIZARD" "${args[@]}" \
		>"$dir/serve.log" 2>&1 </dev/null &
	echo $! >"$dir/pid"
}

wait_node() {
	local i=$1 n=$2 addr pid
	addr=$(node_addr "$i")
	pid=$(cat "$(node_dir "$n")/pid")
	for _ in $(seq 1 240); do
		if curl -fsS -o /dev/null --max-time 2 "http://$addr:8080/healthz" 2>/dev/null; then
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || { tail -30 "$(node_dir "$n")/serve.log" >&2; die "node $n exited"; }
		sleep 0.5
	done
	tail -30 "$(node_dir "$n")/serve.log" >&2
	die "node $n did not answer within 120 s"
}

up() {
	local detach=0
	[ "${1:-}" = -d ] && detach=1
	config
	check_config
	if [ -f "$DIR/cluster.env" ]; then
		log "cleaning up a cluster left in $DIR"
		(config saved; cleanup)
	fi
	mkdir -p "$DIR"
	chmod 755 "$DIR"
	save_config
	echo $$ >"$DIR/up.pid"
	if [ "$detach" = 0 ]; then
		trap 'log "stopping"; cleanup; exit 0' INT TERM
		trap 'cleanup' EXIT
	else
		trap 'rc=$?; [ $rc = 0 ] || cleanup' EXIT
	fi

	# The cluster's bridge, on the host. Its MAC is fixed: a bridge left to
	# pick its own takes the lowest of its ports' and changes it as each
	# node's veth joins, while nodes that started earlier keep the old one
	# in their neighbour cache and lose the host (PostgreSQL, the object
	# store) for up to a minute.
	ip link add "$BRIDGE" address "$(bridge_mac "$BRIDGE")" type bridge
	ip addr add "$NET.1/24" dev "$BRIDGE"
	ip link set "$BRIDGE" up
	echo 1 >/proc/sys/net/ipv4/ip_forward
	# Nodes (and their sandboxes, NATed by each node) reach what the host
	# reaches, through it.
	nft -f - <<EOF
table ip ${BRIDGE}_nat {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr $NET.0/24 oifname != "$BRIDGE" masquerade
	}
}
EOF

	local password
	password=$(random_hex 16)
	API_KEY=lz_$(random_hex 20)
	random_hex 32 >"$DIR/secret"
	chmod 600 "$DIR/secret"
	DATABASE="postgres://lizard:$password@$NET.1:$PG_PORT/lizard?sslmode=disable"
	printf '%s\n' "$DATABASE" >"$DIR/database"
	chmod 600 "$DIR/database"
	start_postgres "$password"
	S3_KEY=LZ$(random_hex 9)
	S3_SECRET=$(random_hex 20)
	start_objstore

	local i=0 n
	for n in $NODES; do
		i=$((i + 1))
		local ns veth
		ns=$(node_ns "$n")
		veth=$(node_veth "$n")
		ip netns add "$ns"
		ip link add "$veth" type veth peer name eth0 netns "$ns"
		ip link set "$veth" master "$BRIDGE" up
		ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
		ip -n "$ns" link set eth0 up
		ip -n "$ns" link set lo up
		ip -n "$ns" route add default via "$NET.1"
	done
	# The first node makes the default project and its key; then the rest.
	i=0
	for n in $NODES; do
		i=$((i + 1))
		start_node "$i" "$n"
		if [ "$i" = 1 ]; then
			wait_node "$i" "$n"
		fi
	done
	i=0
	for n in $NODES; do
		i=$((i + 1))
		wait_node "$i" "$n"
	done

	local first
	first=$(node_addr 1)
	echo
	i=0
	for n in $NODES; do
		i=$((i + 1))
		printf 'node %s  http://%s:8080  proxy %s:8081  internal %s:7070  pid %s  log %s\n' \
			"$n" "$(node_addr "$i")" "$(node_addr "$i")" "$(node_addr "$i")" "$(cat "$(node_dir "$n")/pid")" "$(node_dir "$n")/serve.log"
	done
	echo
	echo "export LIZARD_API_URL=http://$first:8080 LIZARD_API_KEY=$API_KEY"
	echo
	echo "previews: http://<sandbox>-<port>.sandbox.localhost:8081 through any node's proxy, e.g."
	echo "  curl --connect-to ::$first:8081 'http://<sandbox>-<port>.sandbox.localhost:8081/?lizard_token=<token>'"
	echo "E2B SDKs: export E2B_API_URL=http://$first:8080 E2B_API_KEY=$API_KEY E2B_SANDBOX_URL=http://$first:8081"
	echo "nodes:    $LIZARD nodes ls --database \"\$(cat $DIR/database)\""
	echo "object store: versitygw at http://$NET.1:$S3_PORT, bucket lizard (AWS_ACCESS_KEY_ID=$S3_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET)"
	echo
	if [ "$detach" = 1 ]; then
		rm -f "$DIR/up.pid"
		echo "stop with: make cluster-down"
		return 0
	fi
	echo "Ctrl-C (or make cluster-down) stops the cluster and cleans everything."
	while :; do
		sleep 1 &
		wait $! || true
	done
}

# cleanup stops and removes whatever up made, from the names alone (it
# works after a kill -9 of up too): node processes and their sandboxes,
# mounts, loop devices, namespaces, cgroups, the bridge, PostgreSQL, state.
cleanup() {
	trap - EXIT INT TERM
	local i=0 n dir pid root
	for n in $NODES; do
		dir=$(node_dir "$n")
		if [ -f "$dir/pid" ]; then
			pid=$(cat "$dir/pid")
			kill -TERM "$pid" 2>/dev/null || true
		fi
	done
	for n in $NODES; do
		dir=$(node_dir "$n")
		[ -f "$dir/pid" ] || continue
		pid=$(cat "$dir/pid")
		for _ in $(seq 1 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
	done
	for n in $NODES; do
		i=$((i + 1))
		dir=$(node_dir "$n")
		root=$(runsc_root "$dir/data")
		# The node's sandboxes: runsc's processes name its state dir.
		for _ in $(seq 1 50); do
			pkill -KILL -f -- "$root" || break
			sleep 0.1
		done
		for root in "$root" "/run/lizard/runsc-build-lzbb-$n"; do
			umount_under "$root"
			rm -rf "$root"
		done
		# Sandbox (and build) namespaces: <cgroup parent>-<id>.
		local f
		for f in /run/netns/"$(node_cgroup "$n")"-*; do
			[ -e "$f" ] || continue
			[[ ${f##*/} =~ ^$(node_cgroup "$n")-[a-z][a-z0-9]*$ ]] || continue
			umount -l "$f" 2>/dev/null || true
			rm -f "$f"
		done
		ip netns del "$(node_ns "$n")" 2>/dev/null || true
		ip link del "$(node_veth "$n")" 2>/dev/null || true
		remove_cgroups "$(node_cgroup "$n")"
		remove_cgroups "$(node_cgroup "$n")-build"
	done
	umount_under "$DIR"
	if command -v losetup >/dev/null; then
		losetup -n -O NAME,BACK-FILE -l 2>/dev/null | while read -r dev file; do
			case $file in "$DIR"/*) losetup -d "$dev" 2>/dev/null || true ;; esac
		done
	fi
	if [ -f "$DIR/s3/pid" ]; then
		kill -KILL "$(cat "$DIR/s3/pid")" 2>/dev/null || true
	fi
	if [ -f "$DIR/pg/postmaster.pid" ]; then
		pg pg_ctl -D "$DIR/pg" -m fast -w -t 30 stop >/dev/null 2>&1 || true
	fi
	nft delete table ip "${BRIDGE}_nat" 2>/dev/null || true
	ip link del "$BRIDGE" 2>/dev/null || true
	rm -rf "$DIR"
	log "cleaned up"
}

# umount_under unmounts every mount at or below dir, deepest first.
umount_under() {
	local dir=$1 m
	awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do
		umount -l "$m" 2>/dev/null || true
	done
}

# remove_cgroups removes cgroup parent p and the sandboxes' cgroups below
# it in every hierarchy (cgroup v1: one per controller; v2: one).
remove_cgroups() {
	local p=$1 d left
	for _ in $(seq 1 50); do
		left=0
		for d in /sys/fs/cgroup/*/"$p"/* /sys/fs/cgroup/"$p"/* /sys/fs/cgroup/*/"$p" /sys/fs/cgroup/"$p"; do
			[ -d "$d" ] || continue
			rmdir "$d" 2>/dev/null || left=1
		done
		[ "$left" = 0 ] && return 0
		sleep 0.1 # the last processes are being reaped
	done
	log "warning: cgroups of $p are left"
}

down() {
	config saved
	if [ -f "$DIR/up.pid" ]; then
		local pid
		pid=$(cat "$DIR/up.pid")
		if kill -TERM "$pid" 2>/dev/null; then
			log "stopping the cluster started by pid $pid"
			for _ in $(seq 1 600); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.1
			done
		fi
	fi
	cleanup
}

case ${1:-} in
up) up "${2:-}" ;;
down) down ;;
*)
	echo "usage: $0 up [-d] | down" >&2
	exit 2
	;;
esac
