package template

import (
	"context"
	"os"
	"path/filepath"
)

// The desktop template: an X display (Xvfb :0) with openbox, Chromium,
// xdotool for input, x11vnc and noVNC to watch or drive it from a browser,
// and lizard-desktop, the program the server and the SDKs call to start,
// stop and photograph it.

// desktopPackages are installed on top of the base packages. apt installs
// without recommends, so everything the desktop runs is named here: fonts
// (a page without them renders as boxes), imagemagick for import, which
// takes the screenshots, util-linux for setsid and flock.
var desktopPackages = []string{
	"xvfb", "openbox", "chromium", "xdotool", "x11vnc", "novnc", "websockify",
	"imagemagick", "fonts-dejavu-core", "fonts-liberation", "util-linux",
}

// desktopEnv lets commands that an SDK sends as plain argv (xdotool,
// chromium) find the display without a DISPLAY in the request.
const desktopEnv = "DISPLAY=:0"

// desktopRevision is the desktop recipe's Revision: 1, x11vnc in its
// threaded mode.
const desktopRevision = 1

// withRevision returns r at revision n.
func withRevision(r recipe, n int) recipe {
	r.Revision = n
	return r
}

// withEnv returns r with kv added to its default environment.
func withEnv(r recipe, kv ...string) recipe {
	r.Env = append(append([]string(nil), r.Env...), kv...)
	return r
}

// desktopPost are the desktop template's own steps.
var desktopPost = []postStep{
	{"writing the chromium wrapper", writeExecutable("usr/local/bin/chromium", chromiumWrapper)},
	{"writing chromium's policy", writeFile("etc/chromium/policies/managed/lizard.json", chromiumPolicy, 0o644)},
	{"writing lizard-desktop", writeExecutable("usr/local/bin/lizard-desktop", lizardDesktopScript)},
}

// desktopChecks make sure every program lizard-desktop starts is there.
var desktopChecks = [][]string{
	{"sh", "-c", `for p in Xvfb openbox x11vnc websockify xdotool import setsid flock lizard-desktop; do command -v "$p" >/dev/null || { echo "missing: $p"; exit 1; }; done`},
	{"test", "-f", "/usr/share/novnc/vnc.html"},
	{"/usr/local/bin/chromium", "--version"},
	{"sh", "-n", "/usr/local/bin/lizard-desktop"},
}

func writeExecutable(rel, content string) func(context.Context, string, runIn) error {
	return writeFile(rel, content, 0o755)
}

func writeFile(rel, content string, mode os.FileMode) func(context.Context, string, runIn) error {
	return func(_ context.Context, rootfs string, _ runIn) error {
		p := filepath.Join(rootfs, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return replaceFile(p, []byte(content), mode)
	}
}

// chromiumWrapper comes first in PATH, so `chromium URL` works as the SDKs
// run it: as root (the sandbox is the isolation, so Chromium's own sandbox,
// which needs user namespaces, is off; --test-type keeps the warning bar
// about that off the screen), without a GPU, without the first-run
// and background traffic a throwaway browser does not need, and with a
// profile in /tmp per user so that root and user do not share one.
const chromiumWrapper = `#!/bin/sh
exec /usr/bin/chromium \
	--no-sandbox --test-type --disable-gpu --disable-dev-shm-usage \
	--no-first-run --no-default-browser-check --password-store=basic \
	--disable-background-networking --disable-component-update --disable-sync --disable-quic \
	--start-maximized --user-data-dir="/tmp/lizard-chromium-$(id -u)" \
	"$@"
`

// chromiumPolicy turns off what would put dialogs or bars over pages.
const chromiumPolicy = `{
  "DefaultBrowserSettingEnabled": false,
  "PromotionalTabsEnabled": false,
  "MetricsReportingEnabled": false,
  "TranslateEnabled": false,
  "PasswordManagerEnabled": false,
  "BrowserSignin": 0,
  "AutofillAddressEnabled": false,
  "AutofillCreditCardEnabled": false
}
`

// lizardDesktopScript is lizard-desktop. It is a shell script, not a Go
// program: the template is built from Debian packages alone (no lizard
// binary has to be copied in and kept in step), and every piece it drives
// is a program anyway.
//
// Processes are started with setsid and their pids kept under
// /run/lizard-desktop (root's; /tmp is anyone's), so that they outlive the
// exec that started them and a later exec finds them. flock makes
// concurrent starts and stops take turns.
const lizardDesktopScript = `#!/bin/sh
# lizard-desktop: the desktop of a lizard sandbox.
#
#   lizard-desktop start [WIDTH HEIGHT]   start it (if it is not running); prints "running W H"
#   lizard-desktop status                 "running W H" or "stopped"
#   lizard-desktop stop                   stop it
#   lizard-desktop screenshot [--path]    a PNG of the screen: to stdout, or to a file whose path is printed
#
# The screen is Xvfb :0; openbox manages windows; x11vnc serves it on
# 127.0.0.1:5900 (interactive) and 127.0.0.1:5901 (view only); websockify
# serves noVNC on 6080 (for 5900) and 6081 (for 5901).
set -u
export DISPLAY="${DISPLAY:-:0}"
run=/run/lizard-desktop
components="websockify-view websockify x11vnc-view x11vnc openbox xvfb"

die() { echo "lizard-desktop: $*" >&2; exit 1; }

alive() {
	[ -f "$run/$1.pid" ] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null
}

# spawn NAME CMD...: starts CMD in a session of its own, output to NAME.log.
spawn() {
	name=$1
	shift
	# 9>&-: the lock stays with this script, not with the desktop.
	setsid "$@" </dev/null >"$run/$name.log" 2>&1 9>&- &
	echo $! >"$run/$name.pid"
}

display_up() {
	xdotool getdisplaygeometry >/dev/null 2>&1
}

listening() {
	python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()' "$1" 2>/dev/null
}

# wait_for WHAT CMD...: retries CMD for up to 20 s.
wait_for() {
	what=$1
	shift
	i=0
	until "$@"; do
		i=$((i + 1))
		[ "$i" -lt 200 ] || die "$what did not come up; logs in $run"
		sleep 0.1
	done
}

status() {
	if alive xvfb && geometry=$(xdotool getdisplaygeometry 2>/dev/null); then
		echo "running $geometry"
	else
		echo stopped
	fi
}

start() {
	width=${1:-1280}
	height=${2:-800}
	case "$width$height" in *[!0-9]*) die "width and height must be numbers" ;; esac
	if ! alive xvfb; then
		# A display left by a killed Xvfb would make the new one refuse :0.
		rm -f /tmp/.X0-lock /tmp/.X11-unix/X0
		mkdir -p /tmp/.X11-unix
		chmod 1777 /tmp/.X11-unix
		spawn xvfb Xvfb :0 -screen 0 "${width}x${height}x24" -nolisten tcp -ac -dpi 96
		wait_for Xvfb display_up
	fi
	alive openbox || spawn openbox openbox
	# -threads: in gVisor, x11vnc's single-threaded loop spins a core each
	# from the start and answers a new VNC client after seconds to
	# minutes; threaded, it idles and answers at once.
	alive x11vnc || spawn x11vnc x11vnc -display :0 -rfbport 5900 -localhost -forever -shared -nopw -quiet -threads
	alive x11vnc-view || spawn x11vnc-view x11vnc -display :0 -rfbport 5901 -localhost -viewonly -forever -shared -nopw -quiet -threads
	alive websockify || spawn websockify websockify --web /usr/share/novnc 6080 127.0.0.1:5900
	alive websockify-view || spawn websockify-view websockify --web /usr/share/novnc 6081 127.0.0.1:5901
	for port in 5900 5901 6080 6081; do
		wait_for "port $port" listening "$port"
	done
	status
}

stop() {
	for c in $components; do
		alive "$c" && kill "$(cat "$run/$c.pid")" 2>/dev/null
	done
	i=0
	for c in $components; do
		while alive "$c" && [ "$i" -lt 50 ]; do
			i=$((i + 1))
			sleep 0.1
		done
		alive "$c" && kill -9 "$(cat "$run/$c.pid")" 2>/dev/null
		rm -f "$run/$c.pid"
	done
	echo stopped
}

screenshot() {
	display_up || die "the desktop is not running: start it first"
	f=$(mktemp --suffix=.png /tmp/lizard-screenshot-XXXXXXXXXX) || exit 1
	# png24: always 8-bit RGB, whatever colours the screen has, so that
	# readers need not handle palettes.
	if ! import -window root -silent "png24:$f"; then
		rm -f "$f"
		die "screenshot failed"
	fi
	if [ "${1:-}" = --path ]; then
		echo "$f"
	else
		cat "$f"
		rm -f "$f"
	fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
start | stop | status)
	mkdir -p "$run"
	exec 9>"$run/lock"
	flock 9
	"$cmd" "$@"
	;;
screenshot) screenshot "$@" ;;
*)
	echo "usage: lizard-desktop start [WIDTH HEIGHT] | status | stop | screenshot [--path]" >&2
	exit 2
	;;
esac
`
