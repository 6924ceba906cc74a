//go:build linux

package template

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

const aptTranscript = `Hit:1 http://mirror.example/debian bookworm InRelease
Reading package lists...
Building dependency tree...
The following NEW packages will be installed:
  libnode108 nodejs
0 upgraded, 3 newly installed, 0 to remove and 0 not upgraded.
Need to get 12.0 MB of archives.
Get:1 http://mirror.example/debian bookworm/main amd64 libuv1 amd64 1.44.2-1 [140 kB]
Get:2 http://mirror.example/debian bookworm/main amd64 libnode108 amd64 18.20.4+dfsg-1~deb12u1 [11 MB]
Get:3 http://mirror.example/debian bookworm/main amd64 nodejs amd64 18.20.4+dfsg-1~deb12u1 [300 kB]
Unpacking libuv1:amd64 (1.44.2-1) ...
Unpacking libnode108:amd64 (18.20.4+dfsg-1~deb12u1) ...
Setting up libuv1:amd64 (1.44.2-1) ...
W: a warning
`

func TestAptProgress(t *testing.T) {
	var buf bytes.Buffer
	rep := newReporter(&buf, "node")
	clock := rep.start
	rep.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	rep.setStep(stepFinish)
	p := &aptProgress{rep: rep}
	for _, l := range strings.Split(aptTranscript, "\n") {
		p.line(l)
	}
	if p.total != 3 || p.got != 3 || p.unpacked != 2 || p.setUp != 1 {
		t.Errorf("progress = %+v", *p)
	}
	rep.heartbeat(0)
	out := buf.String()
	if !strings.Contains(out, "[node] step 5/5 configuring template: apt-get: 3 packages, 3 downloaded, 2 unpacked, 1 set up (") {
		t.Errorf("no progress line in:\n%s", out)
	}
	if !strings.Contains(out, "[node] W: a warning\n") {
		t.Errorf("warning not shown in:\n%s", out)
	}
	if tail := rep.outputTail(); len(tail) == 0 || tail[len(tail)-1] != "W: a warning" {
		t.Errorf("tail = %q", tail)
	}
}
