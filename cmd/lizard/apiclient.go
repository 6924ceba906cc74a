package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// defaultAPIURL is `lizard serve`'s default address; LIZARD_API_URL
// overrides it, as for the SDKs.
const defaultAPIURL = "http://127.0.0.1:8080"

// newAPIClient is the CLI's client of the lizard API (`lizard sandbox …`,
// `lizard mcp`): LIZARD_API_URL and LIZARD_API_KEY.
func newAPIClient() (*apiclient.Client, error) {
	key := os.Getenv("LIZARD_API_KEY")
	if key == "" {
		return nil, errors.New("LIZARD_API_KEY is not set (create a key with `lizard keys create --project P`)")
	}
	base := os.Getenv("LIZARD_API_URL")
	if base == "" {
		base = defaultAPIURL
	}
	c, err := apiclient.New(base, key, nil)
	if err != nil {
		return nil, fmt.Errorf("LIZARD_API_URL: %w", err)
	}
	return c, nil
}

// printJSON prints an answer of the API as it came, indented.
func printJSON(raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		buf.Reset()
		buf.Write(raw)
	}
	buf.WriteByte('\n')
	_, err := os.Stdout.Write(buf.Bytes())
	return err
}

// exitStatus makes the CLI exit with a remote command's status, without a
// message.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
