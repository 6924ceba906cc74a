package ready

import (
	"maps"
	"testing"
)

func TestListenPorts(t *testing.T) {
	procNet := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 9 1 0000000000000000 100 0 0 10 0
   1: 00000000:C33F 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F40 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 8 1 0000000000000000 20 4 30 10 -1
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:0BB8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5 1 0000000000000000 100 0 0 10 0
`
	// 8000 and 3000 listen; 49983 (0xC33F) is the agent's; the 01 line is a
	// connection.
	want := map[int]bool{8000: true, 3000: true}
	if got := listenPorts(procNet); !maps.Equal(got, want) {
		t.Fatalf("listenPorts = %v, want %v", got, want)
	}
	if got := listenPorts(""); len(got) != 0 {
		t.Fatalf("listenPorts of nothing = %v", got)
	}
}

func TestQuoteArgv(t *testing.T) {
	got := QuoteArgv([]string{"sh", "-c", "sleep 1; echo $HOME", ""})
	if want := `sh -c "sleep 1; echo $HOME" ""`; got != want {
		t.Fatalf("QuoteArgv = %s, want %s", got, want)
	}
}
