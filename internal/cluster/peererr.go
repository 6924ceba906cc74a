package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// An /internal/v1 call that fails answers the status and code the API
// would, with the error's class (errdefs.ClassName) and its client message
// (peerError); the calling node rebuilds an error of that class
// (peerAnswer), so its client gets what the peer would have answered: a
// peer's 409 is a 409, not a 500. Both ends of that are in this file.

// peerError is the body of a failed /internal/v1 call.
type peerError struct {
	Class   string `json:"class"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// A refusal for a limit (errdefs.Exceeded) says which and how much.
	Unit   string  `json:"unit,omitempty"`
	Limit  float64 `json:"limit,omitempty"`
	InUse  float64 `json:"inUse,omitempty"`
	Needed float64 `json:"needed,omitempty"`
}

// writePeerError answers a failed /internal/v1 call with err. Only the
// client message crosses; the whole error goes to this node's log.
func writePeerError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status, code, msg := api.StatusOf(err)
	if status >= 500 {
		log.Warn("internal call failed", "from", r.Header.Get(headerNode), "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	} else {
		log.Debug("internal call refused", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	api.SetRetryAfter(w, err)
	body := peerError{Class: errdefs.ClassName(err), Code: code, Message: msg}
	if ex := (*errdefs.Exceeded)(nil); errors.As(err, &ex) {
		body.Unit, body.Limit, body.InUse, body.Needed = ex.Unit, ex.Limit, ex.InUse, ex.Needed
	}
	api.WriteJSON(w, status, body)
}

// peerAnswer is the error of node n's answer resp (not a 200) to an
// /internal/v1 call. A peerError of a known class comes back as that
// class, code and message (an Exceeded's details too); any other 503 (a
// node that is stopping, a proxy in between) is a retryable ErrUnavailable;
// anything else is an error of no class (a 500 to the client: a peer that
// refuses the cluster's signature is this cluster's fault, not the
// client's). What the peer said is kept for the log, never the message.
func peerAnswer(n store.Node, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusal))
	var pe peerError
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct == "application/json" && json.Unmarshal(b, &pe) == nil {
		if class := errdefs.ClassNamed(pe.Class); class != nil {
			err := errdefs.WithCause(class, pe.Message, fmt.Errorf("node %s answered %s", n.Name, resp.Status))
			if pe.Unit != "" {
				err = &errdefs.Exceeded{Unit: pe.Unit, Limit: pe.Limit, InUse: pe.InUse, Needed: pe.Needed, Err: err}
			}
			if pe.Code != "" {
				err = errdefs.WithCode(pe.Code, err)
			}
			return err
		}
	}
	if resp.StatusCode == http.StatusServiceUnavailable {
		return errdefs.WithCode(codeNodeUnavailable, errdefs.WithCause(errdefs.ErrUnavailable,
			fmt.Sprintf("node %s cannot serve this now; retry shortly", n.Name), fmt.Errorf("%s: %s", resp.Status, b)))
	}
	return fmt.Errorf("node %s: %s %s", n.Name, resp.Status, b)
}

// unreachable is the error of a peer that could not be dialled: its
// address stays in the log.
func unreachable(n store.Node, err error) error {
	return errdefs.WithCode(codeNodeUnavailable, errdefs.WithCause(errdefs.ErrUnavailable,
		fmt.Sprintf("node %s cannot be reached now; retry shortly", n.Name), err))
}

// refused reports whether err is a node's refusal that another node may
// not give (a 503: at capacity, lease lapsed, unreachable), so the next
// candidate is tried.
func refused(err error) bool {
	status, _, _ := api.StatusOf(err)
	return status == http.StatusServiceUnavailable
}
