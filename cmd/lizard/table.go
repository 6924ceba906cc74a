package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// newTabWriter is the CLI's one table layout.
func newTabWriter(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// printTable prints rows under header, in aligned columns.
func printTable(w io.Writer, header []string, rows [][]string) error {
	tw := newTabWriter(w)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}
