# Prints, for each failing Go test in a go test log (not -v), its header and
# the last of its messages (the first line of each t.Log/t.Error), and the
# failures a node --test run reported inside it (the spec reporter's
# "failing tests" section).
function flush() {
	if (head == "") return
	print head
	from = cnt > keep ? cnt - keep : 0
	for (i = from; i < cnt; i++) print msgs[i % keep]
	for (i = 0; i < ncnt; i++) print node[i]
	head = ""; cnt = 0; ncnt = 0; innode = 0
}
BEGIN { keep = 10; nodekeep = 40 }
/^[[:space:]]*--- FAIL/ { flush(); head = $0; next }
head != "" && /^(ok|FAIL|PASS|---|===)/ { flush(); next }
head != "" && /harness_test\.go:[0-9]+: ✖ failing tests:/ { innode = 1 }
head != "" && innode && /harness_test\.go:440: / { if (ncnt < nodekeep) node[ncnt++] = $0; next }
head != "" && /^[[:space:]]+[A-Za-z0-9_]+_test\.go:[0-9]+: / && !/harness_test\.go:440: / { msgs[cnt % keep] = $0; cnt++ }
END { flush() }
