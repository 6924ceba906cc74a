package mcp

import (
	"context"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// progressEvery is how often a long call reports its progress.
const progressEvery = time.Second

// cleanupTimeout bounds what a cancelled call still does (killing its
// command in the sandbox).
const cleanupTimeout = 30 * time.Second

// progress reports a long call's progress to a client that asked for it
// (a progressToken in the call's _meta): at once, then every
// progressEvery until stopped, the seconds elapsed out of total (0:
// unknown) and the latest message. A client that did not ask gets nothing.
type progress struct {
	mu   sync.Mutex
	msg  string
	stop chan struct{}
	done chan struct{}
}

// startProgress starts reporting with message msg; call end before the
// call answers, so that no notification follows the answer.
func startProgress(ctx context.Context, req *sdk.CallToolRequest, total float64, msg string) *progress {
	p := &progress{msg: msg, stop: make(chan struct{}), done: make(chan struct{})}
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		close(p.done)
		return p
	}
	go func() {
		defer close(p.done)
		start := time.Now()
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		last := -1.0
		for {
			// Progress must grow with every notification.
			at := time.Since(start).Seconds()
			if at <= last {
				at = last + 0.001
			}
			last = at
			params := &sdk.ProgressNotificationParams{ProgressToken: token, Progress: at, Message: p.message()}
			if total > 0 && at < total {
				params.Total = total
			}
			if req.Session.NotifyProgress(ctx, params) != nil {
				return // the client went
			}
			select {
			case <-t.C:
			case <-p.stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return p
}

// say sets the message of the next notifications.
func (p *progress) say(msg string) {
	p.mu.Lock()
	p.msg = msg
	p.mu.Unlock()
}

func (p *progress) message() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.msg
}

// end stops reporting and waits until no notification is being sent.
func (p *progress) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}
