package server

import "testing"

func TestBackgroundLog(t *testing.T) {
	var b bgLog
	for i := range maxBackgroundLines + 5 {
		b.add(7, "stdout", string(rune('a'+i%26)))
	}
	all := b.since(0)
	if len(all.Lines) != maxBackgroundLines || all.Next != maxBackgroundLines+5 || all.Lines[0].Seq != 5 {
		t.Fatalf("ring: %d lines, next %d, first seq %d", len(all.Lines), all.Next, all.Lines[0].Seq)
	}
	tail := b.since(all.Next - 2)
	if len(tail.Lines) != 2 || tail.Lines[1].Seq != all.Next-1 || tail.Lines[0].Pid != 7 {
		t.Fatalf("since: %+v", tail)
	}
	if none := b.since(all.Next); len(none.Lines) != 0 || none.Lines == nil {
		t.Fatalf("nothing new must be an empty list: %+v", none)
	}
}
