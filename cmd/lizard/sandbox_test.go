package main

import (
	"slices"
	"testing"
)

func TestParseCopyArg(t *testing.T) {
	tests := []struct {
		arg     string
		remote  bool
		id, p   string
		wantErr bool
	}{
		{arg: "abc:/tmp/x", remote: true, id: "abc", p: "/tmp/x"},
		{arg: "abc:/dir/", remote: true, id: "abc", p: "/dir/"},
		{arg: "./local:file"},
		{arg: "/abs/path"},
		{arg: "file.txt"},
		{arg: "-"},
		{arg: ":/x"},
		{arg: "abc:relative", wantErr: true},
	}
	for _, tt := range tests {
		got, remote, err := parseCopyArg(tt.arg)
		if (err != nil) != tt.wantErr || remote != tt.remote || got.id != tt.id || got.path != tt.p {
			t.Errorf("parseCopyArg(%q) = %+v, %v, %v; want {%s %s}, %v, error %v", tt.arg, got, remote, err, tt.id, tt.p, tt.remote, tt.wantErr)
		}
	}
}

func TestSplitCommand(t *testing.T) {
	before, argv, dashed := splitCommand([]string{"id", "--env", "A=1", "--", "ls", "--", "-la"})
	if !slices.Equal(before, []string{"id", "--env", "A=1"}) || !slices.Equal(argv, []string{"ls", "--", "-la"}) || !dashed {
		t.Fatalf("got %q %q %v", before, argv, dashed)
	}
	before, argv, dashed = splitCommand([]string{"id", "echo hi"})
	if !slices.Equal(before, []string{"id", "echo hi"}) || argv != nil || dashed {
		t.Fatalf("got %q %q %v", before, argv, dashed)
	}
}

func TestExitWith(t *testing.T) {
	for code, want := range map[int]error{0: nil, 3: exitStatus(3), -1: exitStatus(255), 300: exitStatus(255)} {
		if got := exitWith(code); got != want {
			t.Errorf("exitWith(%d) = %v, want %v", code, got, want)
		}
	}
}
