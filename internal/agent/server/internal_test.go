package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/lizard-build/lizard/internal/agent"
)

func TestSplitLines(t *testing.T) {
	long := strings.Repeat("x", 100)
	huge := strings.Repeat("y", maxLine+10)
	// want lists the lines; "|partial" marks one that had no newline.
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"empty", "", nil},
		{"one line", "a\n", []string{"a"}},
		{"no final newline", "a\nb", []string{"a", "b|partial"}},
		{"empty lines", "\n\na\n", []string{"", "", "a"}},
		{"line longer than the buffer", long + "\nz\n", []string{long, "z"}},
		{"long last line without newline", "a\n" + long, []string{"a", long + "|partial"}},
		{"line longer than maxLine is split", huge + "\n", []string{huge[:maxLine] + "|partial", huge[maxLine:]}},
		{"carriage returns are kept", "a\r\n", []string{"a\r"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			// The smallest buffer bufio allows forces line assembly.
			r := bufio.NewReaderSize(strings.NewReader(tt.in), 16)
			err := splitLines(r, func(l string, partial bool) {
				if partial {
					l += "|partial"
				}
				got = append(got, l)
			})
			if !errors.Is(err, io.EOF) {
				t.Fatalf("err = %v, want EOF", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %d lines %.40q, want %d lines %.40q", len(got), got, len(tt.want), tt.want)
			}
		})
	}
}

func TestPermString(t *testing.T) {
	tests := []struct {
		mode uint32
		want string
	}{
		{syscall.S_IFREG | 0o644, "-rw-r--r--"},
		{syscall.S_IFDIR | 0o755, "drwxr-xr-x"},
		{syscall.S_IFLNK | 0o777, "lrwxrwxrwx"},
		{syscall.S_IFDIR | 0o1777, "drwxrwxrwt"},
		{syscall.S_IFDIR | 0o1770, "drwxrwx--T"},
		{syscall.S_IFREG | 0o4755, "-rwsr-xr-x"},
		{syscall.S_IFREG | 0o4644, "-rwSr--r--"},
		{syscall.S_IFREG | 0o2755, "-rwxr-sr-x"},
		{syscall.S_IFREG | 0o2745, "-rwxr-Sr-x"},
		{syscall.S_IFIFO | 0o600, "prw-------"},
		{syscall.S_IFSOCK | 0o755, "srwxr-xr-x"},
		{syscall.S_IFCHR | 0o666, "crw-rw-rw-"},
		{syscall.S_IFBLK | 0o660, "brw-rw----"},
	}
	for _, tt := range tests {
		if got := permString(tt.mode); got != tt.want {
			t.Errorf("permString(%o) = %q, want %q", tt.mode, got, tt.want)
		}
	}
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		in   string
		want procInfo
		ok   bool
	}{
		{"123 (sleep) S 45 67 67 0 -1", procInfo{123, 45, 67}, true},
		{"9 (a (weird) name) R 1 9 9 0", procInfo{9, 1, 9}, true},
		{"10 (x) y) S 2 3 3", procInfo{10, 2, 3}, true},
		{"garbage", procInfo{}, false},
		{"12 (short) S", procInfo{}, false},
	}
	for _, tt := range tests {
		got, ok := parseStat(tt.in)
		if ok != tt.ok || got != tt.want {
			t.Errorf("parseStat(%q) = %+v %v, want %+v %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestFramesRoundTrip(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), frameSize/8+3) // more than two frames
	var wire bytes.Buffer
	if err := writeFrames(&wire, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(newFrameReader(&wire))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("round trip: %d bytes, err %v; want %d bytes", len(got), err, len(data))
	}
}

func TestFramesWithoutEndMarkerAreAborted(t *testing.T) {
	var wire bytes.Buffer
	if err := writeFrames(&wire, io.MultiReader(strings.NewReader("abc"), failingReader{})); err == nil {
		t.Fatal("writeFrames hid the read error")
	}
	for _, cut := range []int{wire.Len(), 5, 2} { // whole, inside a payload, inside a header
		_, err := io.ReadAll(newFrameReader(bytes.NewReader(wire.Bytes()[:cut])))
		if !errors.Is(err, errUploadAborted) {
			t.Errorf("cut at %d: err = %v, want errUploadAborted", cut, err)
		}
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestToAPIError(t *testing.T) {
	pathErr := func(e syscall.Errno) error { return &fs.PathError{Op: "open", Path: "/x", Err: e} }
	tests := []struct {
		err        error
		wantStatus int
		wantCode   string
	}{
		{pathErr(syscall.EACCES), 403, codePermission},
		{pathErr(syscall.EPERM), 403, codePermission},
		{pathErr(syscall.ENOENT), 404, codeNotFound},
		{pathErr(syscall.EISDIR), 400, codeInvalid},
		{pathErr(syscall.ENOTDIR), 400, codeInvalid},
		{pathErr(syscall.EINVAL), 400, codeInvalid},
		{pathErr(syscall.EEXIST), 409, codeConflict},
		{pathErr(syscall.ENOTEMPTY), 409, codeConflict},
		{pathErr(syscall.ENOSPC), 409, codeConflict},
		{pathErr(syscall.EIO), 500, codeInternal},
		{&uploadError{errors.New("reset")}, 400, codeInvalid},
		{&http.MaxBytesError{Limit: 10}, 413, codeTooLarge},
		{errInvalid("bad"), 400, codeInvalid},
		{errors.New("boom"), 500, codeInternal},
	}
	for _, tt := range tests {
		ae := toAPIError(tt.err)
		if ae.status != tt.wantStatus || ae.code != tt.wantCode || ae.msg == "" {
			t.Errorf("toAPIError(%v) = %+v, want %d %s", tt.err, ae, tt.wantStatus, tt.wantCode)
		}
	}
}

func TestRecovererAnswersJSON(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	h := s.recoverer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("kaboom") }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	var e agent.Error
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != 500 || e.Code != codeInternal || !strings.Contains(e.Message, "kaboom") {
		t.Fatalf("got %d %q (%v), want a 500 internal JSON error", rec.Code, rec.Body.String(), err)
	}
}

func TestRecovererAbortsStartedAnswer(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	h := s.recoverer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		panic("mid-stream")
	}))
	defer func() {
		if v := recover(); v != http.ErrAbortHandler {
			t.Fatalf("recovered %v, want http.ErrAbortHandler", v)
		}
	}()
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/files", nil))
}

func TestNetworkFSName(t *testing.T) {
	tests := []struct {
		magic int64
		want  string
	}{
		{0x6969, "nfs"},
		{0xff534d42, "cifs"},
		{0x517b, "smb"},
		{0xfe534d42, "smb2"},
		{0x65735546, "fuse"},
		{0xef53, ""},     // ext4
		{0x01021994, ""}, // tmpfs
		{0x794c7630, ""}, // overlayfs
		{0x01021997, ""}, // 9p, as gVisor's gofer mounts say
	}
	for _, tt := range tests {
		if got := networkFSName(tt.magic); got != tt.want {
			t.Errorf("networkFSName(%#x) = %q, want %q", tt.magic, got, tt.want)
		}
	}
}
