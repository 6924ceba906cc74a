package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The headers of a delivery (docs/API-EXTENSIONS.md, "Webhooks"). The
// signature is HMAC-SHA256, keyed with the webhook's secret, of
//
//	<TimestampHeader's value> "." <the request body, byte for byte>
//
// in lowercase hex after "v1=". The timestamp (Unix seconds) is the
// attempt's, so that a receiver can refuse old requests replayed; the
// event's id (EventIDHeader, also in the body) is the same on every
// attempt, so that it can drop repeats.
const (
	SignatureHeader = "Lizard-Signature"
	TimestampHeader = "Lizard-Timestamp"
	EventIDHeader   = "Lizard-Event-Id"
	EventTypeHeader = "Lizard-Event-Type"
	WebhookIDHeader = "Lizard-Webhook-Id"
	DeliveryHeader  = "Lizard-Delivery-Id"
	AttemptHeader   = "Lizard-Delivery-Attempt"
)

// signatureVersion prefixes the signature: another scheme would be v2=.
const signatureVersion = "v1="

// Sign is the SignatureHeader value of body sent at timestamp (Unix
// seconds) with secret.
func Sign(secret string, timestamp int64, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(strconv.FormatInt(timestamp, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return signatureVersion + hex.EncodeToString(m.Sum(nil))
}

// Verify checks a delivery as a receiver would: signature (the
// SignatureHeader value) is secret's over timestamp (the TimestampHeader
// value) and body, and timestamp is within tolerance of now.
func Verify(secret, timestamp, signature string, body []byte, now time.Time, tolerance time.Duration) error {
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("%s %q: not a Unix time", TimestampHeader, timestamp)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%s %d: %s from now, more than %s", TimestampHeader, ts, d.Round(time.Second), tolerance)
	}
	if !strings.HasPrefix(signature, signatureVersion) {
		return fmt.Errorf("%s: want %s<hex>", SignatureHeader, signatureVersion)
	}
	if !hmac.Equal([]byte(signature), []byte(Sign(secret, ts, body))) {
		return errors.New("signature mismatch")
	}
	return nil
}
