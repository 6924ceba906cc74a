#!/usr/bin/env bash
# Runs lizard's tests: installs the npm SDK the e2e tests use, runs every Go
# test (log in $LIZARD_TEST_LOG, default /tmp/lizard-test.log), prints a
# summary and exits with go test's status.
#
# First it measures the machine: `go run ./bench -slowness` times a raw
# runsc create → first exec of the base template (the median of 7, after
# one that warms the caches) and divides it by the 95 ms of the machine the
# tests' waits were set on (internal/slowness.Reference), at least 1. The
# factor is exported as LIZARD_TEST_SLOWNESS and is the log's first line;
# every fixed wait of the tests that drive sandboxes (the e2e harness's
# budget(), the runtime conformance suite, the SDK tests' budget()) is that
# many times longer, never shorter than it was. A LIZARD_TEST_SLOWNESS set
# beforehand is kept (1 when it cannot be measured: no runsc or template).
#
# The tests run in two streams at once (LIZARD_TEST_STREAMS, 1 for one),
# each running one package at a time (-p 1): every package but the
# end-to-end tests, then the cluster's end-to-end tests (test/e2e/cluster_*:
# three nodes in network namespaces of their own on a PostgreSQL of the
# test's own, docs/CLUSTER.md's failure table), then E2B's suites
# (TestE2B) in one; the other end-to-end
# tests, then those that lean on the store again with the servers on
# PostgreSQL (LIZARD_E2E_DATABASE=postgres), in the other. Their names on the
# host are each test's own (test/e2e/isolation_test.go), so what one test
# leaves fails that test alone; the waits are twice as long with two
# streams, which share the machine. The tests that load the whole host on
# purpose (TestRestartBusy: 30 sandboxes burning CPU) run last, alone: next
# to them the other stream's nodes miss their database's deadlines.
#
# Then the packages that need
# neither runsc nor the host's network run again
# under the race detector, and each fuzz target for $LIZARD_FUZZTIME (default
# 30s; 0 skips fuzzing).
#
# `make test` runs this after deps, build and templates, with
# LIZARD_TEMPLATE_DIR and LIZARD_RUNSC set. GO_TEST_FLAGS adds flags to
# go test (e.g. GO_TEST_FLAGS=-v).
set -uo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."

log=${LIZARD_TEST_LOG:-/tmp/lizard-test.log}
# Each end-to-end run appends its slowest tests here (the summary shows them).
export LIZARD_E2E_TIMES=$log.times
rm -f "$LIZARD_E2E_TIMES"

# The agent's tests run commands as root through `bash -l`, which sources
# root's profile. On machines where that runs `pyenv rehash`, a login shell
# killed half-way (the tests kill process trees) leaves pyenv's lock file,
# and every later `bash -l` of root waits on it forever. Remove a stale one
# (no pyenv running) before the tests and after each package that kills
# shells.
clear_pyenv_lock() {
	local lock=${PYENV_ROOT:-$HOME/.pyenv}/shims/.pyenv-shim
	if [ -e "$lock" ] && ! pgrep -f 'pyenv-rehash|libexec/pyenv' > /dev/null; then
		echo "[test] removing a stale pyenv rehash lock ($lock)"
		rm -f "$lock"
	fi
}
clear_pyenv_lock

if [ -f test/e2e/package.json ]; then
	echo "[test] npm install in test/e2e"
	(cd test/e2e && npm install --no-audit --no-fund) || { echo "[test] npm install failed" >&2; exit 1; }
fi

if [ -z "${LIZARD_TEST_SLOWNESS:-}" ]; then
	measurement=$(mktemp)
	if LIZARD_TEST_SLOWNESS=$(go run ./bench -slowness 2>"$measurement"); then
		measured=$(cat "$measurement")
	else
		measured="not measured, waits unscaled: $(cat "$measurement")"
		LIZARD_TEST_SLOWNESS=1
	fi
	rm -f "$measurement"
else
	measured="set beforehand"
fi
export LIZARD_TEST_SLOWNESS
echo "[test] LIZARD_TEST_SLOWNESS=$LIZARD_TEST_SLOWNESS: the tests' waits are that many times today's ($measured)" | tee "$log"
# The go test run's timeouts stretch as well, from today's 60 and 20
# minutes.
go_timeout=$(awk -v f="$LIZARD_TEST_SLOWNESS" 'BEGIN { printf "%dm", 60 * f }')
pg_timeout=$(awk -v f="$LIZARD_TEST_SLOWNESS" 'BEGIN { printf "%dm", 20 * f }')

# -p 1 also makes go build one package at a time: build every test binary
# first with all cores, so that the run below finds them in the build cache
# and only links and runs them.
echo "[test] building the test binaries"
testbins=$(mktemp -d)
go test -c -o "$testbins/" ./... > /dev/null 2>&1 || echo "[test] building the test binaries failed; go test reports why"
rm -rf "$testbins"

# The end-to-end tests that lean on the store most run again with every
# server on PostgreSQL (a private one the test binary starts; a database per
# data directory): keys, projects, restarts over kept state. The SDK's suite
# is not among them: TestClusterSDK runs it whole through a cluster on
# PostgreSQL already.
pg_e2e='^(TestAPIKeys|TestProjectIsolation|TestRestart|TestVolumeSurvives|TestPausedSurvivesReboot|TestBadInput)$'
cluster_e2e='^TestCluster'
alone_e2e='^TestRestartBusy$'
# With two streams, E2B's suites run after the cluster's tests in the first
# stream: the two streams then take about as long (measured: the other
# packages and the cluster's ~2400 s, the other end-to-end tests ~2900 s
# with E2B's ~360 s among them).
moved_e2e='^TestE2B$'
e2e=github.com/lizard-build/lizard/test/e2e
mapfile -t others < <(go list ./... | grep -vx "$e2e")

# stream NAME ARGS… runs go test ARGS… (one package at a time), its output
# in $log.NAME and, each line marked [NAME], on stdout; its status in
# $log.NAME.status.
stream() {
	local name=$1
	shift
	echo "[test] $name: go test $*" | tee -a "$log"
	# shellcheck disable=SC2086 # GO_TEST_FLAGS is a list of flags
	go test -count=1 -p 1 ${GO_TEST_FLAGS:-} "$@" 2>&1 | tee "$log.$name" | sed -u "s/^/[$name] /"
	echo "${PIPESTATUS[0]}" > "$log.$name.status"
}

# LIZARD_TEST_STREAMS (default 2) is how many of these run at once: with
# two, the packages other than the end-to-end tests and then the cluster's
# end-to-end tests in one stream, the other end-to-end tests and then their
# PostgreSQL rerun in the other. Their names on the host are each test's
# own, and each stream's servers have subnets of their own
# (LIZARD_E2E_SALT), so one stream's sandboxes never meet the other's; the
# waits stretch with the streams, since they share the machine.
streams=${LIZARD_TEST_STREAMS:-2}
names=(others e2e-cluster e2e-moved e2e e2e-pg e2e-alone)
echo "[test] go test ./... in $streams stream(s) (LIZARD_TEMPLATE_DIR=${LIZARD_TEMPLATE_DIR:-} LIZARD_RUNSC=${LIZARD_RUNSC:-}; log: $log)"
if [ "$streams" -ge 2 ]; then
	slowness=$LIZARD_TEST_SLOWNESS
	LIZARD_TEST_SLOWNESS=$(awk -v f="$slowness" 'BEGIN { print 2 * f }')
	echo "[test] two streams: LIZARD_TEST_SLOWNESS=$LIZARD_TEST_SLOWNESS" | tee -a "$log"
	(
		stream others -timeout "$go_timeout" "${others[@]}"
		LIZARD_E2E_SALT=c stream e2e-cluster -timeout "$go_timeout" -run "$cluster_e2e" "$e2e"
		LIZARD_E2E_SALT=c stream e2e-moved -timeout "$go_timeout" -run "$moved_e2e" "$e2e"
	) &
	(
		LIZARD_E2E_SALT=s stream e2e -timeout "$go_timeout" -skip "$cluster_e2e|$alone_e2e|$moved_e2e" "$e2e"
		LIZARD_E2E_SALT=s LIZARD_E2E_DATABASE=postgres stream e2e-pg -timeout "$pg_timeout" -run "$pg_e2e" "$e2e"
	) &
	wait
	LIZARD_TEST_SLOWNESS=$slowness
	echo "[test] alone: LIZARD_TEST_SLOWNESS=$LIZARD_TEST_SLOWNESS" | tee -a "$log"
	stream e2e-alone -timeout "$pg_timeout" -run "$alone_e2e" "$e2e"
else
	names=(others e2e-cluster e2e e2e-pg e2e-alone)
	stream others -timeout "$go_timeout" "${others[@]}"
	stream e2e-cluster -timeout "$go_timeout" -run "$cluster_e2e" "$e2e"
	stream e2e -timeout "$go_timeout" -skip "$cluster_e2e|$alone_e2e" "$e2e"
	LIZARD_E2E_DATABASE=postgres stream e2e-pg -timeout "$pg_timeout" -run "$pg_e2e" "$e2e"
	stream e2e-alone -timeout "$pg_timeout" -run "$alone_e2e" "$e2e"
fi
status=0
for name in "${names[@]}"; do
	cat "$log.$name" >> "$log"
	st=$(cat "$log.$name.status" 2>/dev/null || echo 1)
	[ "$st" -eq 0 ] || status=$st
	rm -f "$log.$name" "$log.$name.status"
done

# No runsc, sandboxes or host networking in these (the agent server's tests
# run commands as other users, which needs root but nothing shared).
race_pkgs=(
	./internal/agent
	./internal/agent/server
	./internal/api
	./internal/network
	./internal/proxy
	./internal/sandbox
	./internal/store/...
)
clear_pyenv_lock
echo "[test] go test -race ${race_pkgs[*]}"
# shellcheck disable=SC2086
go test -count=1 -race ${GO_TEST_FLAGS:-} "${race_pkgs[@]}" 2>&1 | tee -a "$log"
race_status=${PIPESTATUS[0]}
[ "$race_status" -eq 0 ] || status=$race_status

# Each fuzz target: package and name.
fuzz_targets=(
	"./internal/api FuzzAPI"
	"./internal/e2b FuzzE2B"
)
fuzztime=${LIZARD_FUZZTIME:-30s}
if [ "$fuzztime" != 0 ]; then
	for target in "${fuzz_targets[@]}"; do
		read -r pkg name <<<"$target"
		echo "[test] fuzz $name in $pkg for $fuzztime"
		go test -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" "$pkg" 2>&1 | grep -v '^fuzz: elapsed' | tee -a "$log"
		fuzz_status=${PIPESTATUS[0]}
		[ "$fuzz_status" -eq 0 ] || status=$fuzz_status
	done
fi

echo
echo "==================== test summary ===================="
grep -E '^ok' "$log" || true
# The end-to-end runs' slowest tests (LIZARD_E2E_TIMES): what the streams
# are balanced by.
sed 's/^/[times] /' "$log.times" 2>/dev/null || true
grep -E '^(FAIL|panic:)|--- FAIL' "$log" || true
if [ "$status" -eq 0 ]; then
	echo "[test] all packages passed"
else
	# What failed, last: a CI page that shows only the output's end shows
	# why (each failing test's last messages, and a node run's failures).
	echo "==================== failures ===================="
	awk -f scripts/failures.awk "$log"
	echo "[test] FAILED (go test exit status $status); full log: $log"
	echo "[test] a fuzz failure's input is in testdata/fuzz/ of its package: go test -run=<Target>/<file> replays it"
fi
exit "$status"
