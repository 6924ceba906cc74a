package agent

import (
	"crypto/sha256"
	"encoding/base64"
)

// FileSignature is the signature of an E2B signed file URL (the SDK's
// downloadUrl/uploadUrl of a secure sandbox): "v1_" and the unpadded
// standard base64 of sha256("path:operation:user:token[:expiration]"),
// operation "read" or "write", expiration "" for none. envd checks it
// (the agent's GET and POST /files); the preview proxy uses it to find the
// sandbox of a URL that names none.
func FileSignature(path, operation, user, token, expiration string) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
