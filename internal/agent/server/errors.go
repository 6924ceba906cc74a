package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
)

// The codes of agent.Error.
const (
	codeInvalid         = "invalid"
	codeUnauthenticated = "unauthenticated"
	codePermission      = "permission"
	codeNotFound        = "not_found"
	codeConflict        = "conflict"
	codeTooLarge        = "too_large"
	codeInternal        = "internal"
)

// apiError is an error that knows the HTTP status and agent.Error code it is
// answered with.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func errInvalid(format string, a ...any) error {
	return &apiError{http.StatusBadRequest, codeInvalid, fmt.Sprintf(format, a...)}
}

func errNotFound(format string, a ...any) error {
	return &apiError{http.StatusNotFound, codeNotFound, fmt.Sprintf(format, a...)}
}

func errConflict(format string, a ...any) error {
	return &apiError{http.StatusConflict, codeConflict, fmt.Sprintf(format, a...)}
}

// uploadError marks a failure to read the request body, so that it is not
// mistaken for a failure of the file system.
type uploadError struct{ err error }

func (e *uploadError) Error() string { return "reading request body: " + e.err.Error() }
func (e *uploadError) Unwrap() error { return e.err }

// toAPIError classifies err. File system errors are classified by errno so
// that the same mapping holds in-process and in the __fileop child:
//
//	EACCES EPERM EROFS                   → 403 permission
//	ENOENT                               → 404 not_found
//	EISDIR ENOTDIR EINVAL ENAMETOOLONG ELOOP → 400 invalid
//	EEXIST ENOTEMPTY EBUSY ETXTBSY EXDEV → 409 conflict
//	ENOSPC EDQUOT                        → 409 conflict (the protocol has no
//	                                       status for a full disk; the message
//	                                       says "no space left on device")
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var ue *uploadError
	if errors.As(err, &ue) {
		return &apiError{http.StatusBadRequest, codeInvalid, err.Error()}
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return &apiError{http.StatusRequestEntityTooLarge, codeTooLarge,
			fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if status, code, ok := errnoClass(errno); ok {
			return &apiError{status, code, err.Error()}
		}
	}
	return &apiError{http.StatusInternalServerError, codeInternal, err.Error()}
}

func errnoClass(errno syscall.Errno) (int, string, bool) {
	switch errno {
	case syscall.EACCES, syscall.EPERM, syscall.EROFS:
		return http.StatusForbidden, codePermission, true
	case syscall.ENOENT:
		return http.StatusNotFound, codeNotFound, true
	case syscall.EISDIR, syscall.ENOTDIR, syscall.EINVAL, syscall.ENAMETOOLONG, syscall.ELOOP:
		return http.StatusBadRequest, codeInvalid, true
	case syscall.EEXIST, syscall.ENOTEMPTY, syscall.EBUSY, syscall.ETXTBSY, syscall.EXDEV,
		syscall.ENOSPC, syscall.EDQUOT:
		return http.StatusConflict, codeConflict, true
	}
	return 0, "", false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// A failed write means the client went away; there is no one to tell.
	_ = json.NewEncoder(w).Encode(v)
}

// decodeJSON reads exactly one JSON value of at most limit bytes into v and
// turns every failure into a 400 (or 413) that names the problem.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errInvalid("request body has data after the JSON object")
	}
	return nil
}

func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF):
		return errInvalid("request body is empty; want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errInvalid("request body is truncated JSON")
	case errors.As(err, &syn):
		return errInvalid("malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return errInvalid("request body: cannot use JSON %s as %s", typ.Value, typ.Type)
		}
		return errInvalid("field %q: cannot use JSON %s as %s", typ.Field, typ.Value, typ.Type)
	case errors.As(err, &mbe):
		return toAPIError(err)
	}
	return errInvalid("bad request body: %v", err)
}
