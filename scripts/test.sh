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
# Packages run one at a time (-p 1): the runtime and end-to-end tests run
# sandboxes, which two packages at once would slow past their waits. Their
# names on the host are each test's own (test/e2e/isolation_test.go), so
# what one test leaves fails that test alone.
# The end-to-end tests include the cluster's (test/e2e/cluster_test.go:
# three nodes in network namespaces of their own on a PostgreSQL of the
# test's own, docs/CLUSTER.md's failure table).
#
# Then the end-to-end tests that lean on the store run again with the servers
# on PostgreSQL (LIZARD_E2E_DATABASE=postgres), the packages that need
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

echo "[test] go test ./... (LIZARD_TEMPLATE_DIR=${LIZARD_TEMPLATE_DIR:-} LIZARD_RUNSC=${LIZARD_RUNSC:-}; log: $log)"
# shellcheck disable=SC2086 # GO_TEST_FLAGS is a list of flags
go test -count=1 -p 1 -timeout "$go_timeout" ${GO_TEST_FLAGS:-} ./... 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}

# The end-to-end tests that lean on the store most, again with every server
# on PostgreSQL (a private one the test binary starts; a database per data
# directory): keys, projects, restarts over kept state. The SDK's suite is
# not among them: TestClusterSDK runs it whole through a cluster on
# PostgreSQL already.
pg_e2e='^(TestAPIKeys|TestProjectIsolation|TestRestart|TestVolumeSurvives|TestPausedSurvivesReboot|TestBadInput)$'
echo "[test] e2e on PostgreSQL: $pg_e2e"
# shellcheck disable=SC2086
LIZARD_E2E_DATABASE=postgres go test -count=1 -p 1 -timeout "$pg_timeout" ${GO_TEST_FLAGS:-} -run "$pg_e2e" ./test/e2e 2>&1 | tee -a "$log"
pg_status=${PIPESTATUS[0]}
[ "$pg_status" -eq 0 ] || status=$pg_status

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
grep -E '^(ok|FAIL|panic:)|--- FAIL' "$log" || true
if [ "$status" -eq 0 ]; then
	echo "[test] all packages passed"
else
	echo "[test] FAILED (go test exit status $status); full log: $log"
	echo "[test] a fuzz failure's input is in testdata/fuzz/ of its package: go test -run=<Target>/<file> replays it"
fi
exit "$status"
