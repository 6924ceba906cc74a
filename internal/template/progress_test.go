package template

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

const transcript = `I: Retrieving InRelease 
I: Checking Release signature
I: Valid Release signature (key id 4D64FEC119C2029067D6E791F8D2585B8783D481)
I: Retrieving Packages 
I: Validating Packages 
I: Resolving dependencies of required packages...
I: Resolving dependencies of base packages...
I: Checking component main on http://mirror.example/debian...
I: Retrieving adduser 3.134
I: Validating adduser 3.134
I: Retrieving apt 2.6.1
I: Validating apt 2.6.1
I: Retrieving base-files 12.4+deb12u11
I: Validating base-files 12.4+deb12u11
W: something odd
I: Chosen extractor for .deb packages: dpkg-deb
I: Extracting adduser...
I: Extracting apt...
I: Extracting base-files...
I: Installing core packages...
I: Unpacking required packages...
I: Unpacking adduser...
I: Configuring required packages...
I: Configuring adduser...
I: Unpacking the base system...
I: Unpacking python3...
I: Configuring the base system...
I: Configuring python3...
I: Base system installed successfully.
`

func TestDebootstrapProgress(t *testing.T) {
	var buf bytes.Buffer
	rep := newReporter(&buf, "base")
	clock := rep.start
	rep.now = func() time.Time { clock = clock.Add(time.Second); return clock }

	lw := &lineWriter{fn: rep.debootstrapLine}
	// Feed in odd-sized chunks to exercise line splitting.
	for s := transcript; len(s) > 0; {
		n := min(7, len(s))
		lw.Write([]byte(s[:n]))
		s = s[n:]
	}
	lw.Flush()
	rep.setStep(stepFinish)

	out := buf.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var steps []string
	for _, l := range lines {
		if !strings.HasPrefix(l, "[base] ") {
			t.Errorf("line without prefix: %q", l)
		}
		if i := strings.Index(l, "step "); i >= 0 {
			steps = append(steps, l[i:i+len("step 1/5")])
		}
	}
	if got, want := strings.Join(steps, ","), "step 1/5,step 2/5,step 3/5,step 4/5,step 5/5"; got != want {
		t.Errorf("steps = %s, want %s\n%s", got, want, out)
	}
	for _, want := range []string{"step 2/5 downloading packages (", "step 3/5 unpacking packages: 0/3 (", "step 4/5 configuring packages: 0/3 ("} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q line:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "debootstrap: W: something odd") {
		t.Errorf("warning not passed on:\n%s", out)
	}
	if !strings.Contains(out, "s)") {
		t.Errorf("no elapsed time:\n%s", out)
	}
	if rep.counts[stepDownload] != 3 || rep.counts[stepUnpack] != 3 || rep.counts[stepConfigure] != 2 {
		t.Errorf("counts = %v", rep.counts)
	}
	// A heartbeat repeats the step with its count.
	buf.Reset()
	rep.heartbeat(0)
	if got := buf.String(); !strings.Contains(got, "step 5/5 configuring template (") {
		t.Errorf("heartbeat = %q", got)
	}
	if tail := rep.outputTail(); len(tail) == 0 || tail[len(tail)-1] != "I: Base system installed successfully." {
		t.Errorf("tail = %q", tail)
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		msg  string
		step int
		pkg  bool
	}{
		{"Retrieving InRelease ", stepResolve, false},
		{"Retrieving Packages ", stepResolve, false},
		{"Retrieving libc6 2.36-9+deb12u10", stepDownload, true},
		{"Validating libc6 2.36-9+deb12u10", stepDownload, false},
		{"Extracting libc6...", stepUnpack, true},
		{"Unpacking required packages...", stepUnpack, false},
		{"Configuring libc6:amd64...", stepConfigure, true},
		{"Configuring required packages...", stepConfigure, false},
		{"Something new", 0, false},
	} {
		step, pkg := classifyDebootstrap(c.msg)
		if step != c.step || pkg != c.pkg {
			t.Errorf("classify(%q) = %d,%v; want %d,%v", c.msg, step, pkg, c.step, c.pkg)
		}
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 150 << 20: "150.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := fmtBytes(n); got != want {
			t.Errorf("fmtBytes(%d) = %q, want %q", n, got, want)
		}
	}
	if got := fmtSeconds(41400 * time.Millisecond); got != "41 s" {
		t.Errorf("fmtSeconds = %q", got)
	}
}

func TestHeartbeatCounts(t *testing.T) {
	var buf bytes.Buffer
	rep := newReporter(&buf, "base")
	rep.debootstrapLine("I: Retrieving libc6 2.36")
	rep.debootstrapLine("I: Retrieving bash 5.2")
	buf.Reset()
	rep.heartbeat(time.Hour) // too soon: nothing
	if buf.Len() != 0 {
		t.Errorf("early heartbeat printed %q", buf.String())
	}
	rep.heartbeat(0)
	if got := buf.String(); !strings.HasPrefix(got, "[base] step 2/5 downloading packages: 2 (") {
		t.Errorf("heartbeat = %q", got)
	}
	rep.debootstrapLine("I: Extracting libc6...")
	buf.Reset()
	rep.heartbeat(0)
	if got := buf.String(); !strings.HasPrefix(got, "[base] step 3/5 unpacking packages: 1/2 (") {
		t.Errorf("heartbeat = %q", got)
	}
}
