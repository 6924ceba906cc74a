package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/lizard-build/lizard/internal/agent"
	pb "github.com/lizard-build/lizard/internal/envd/process"
)

// envdProcess is process.Process over the agent's interactive processes.
type envdProcess struct {
	s *Server
	e *envd
}

// timeoutHeader is Connect's deadline header; envd takes it as the
// process's lifetime (E2B's SDKs send 60 s by default, 0 for none).
const timeoutHeader = "Connect-Timeout-Ms"

func (ep *envdProcess) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	acct, err := ep.e.account(req.Header(), "")
	if err != nil {
		return connectError(err)
	}
	ep.e.mu.RLock()
	env, workdir := maps.Clone(ep.e.env), ep.e.workdir
	ep.e.mu.RUnlock()
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, cfg.GetEnvs())
	if cfg.Cwd != nil {
		if workdir, err = resolvePath("process.cwd", cfg.GetCwd(), acct); err != nil {
			return connectError(err)
		}
	} else if workdir != "" {
		// The configured workdir is the default user's; another user's
		// commands start in their home.
		def, err := ep.e.defaultAccount()
		if err != nil {
			return connectError(err)
		}
		if def.name != acct.name {
			workdir = ""
		}
	}
	var timeoutMs int64
	if v := req.Header().Get(timeoutHeader); v != "" {
		if timeoutMs, err = strconv.ParseInt(v, 10, 64); err != nil || timeoutMs < 0 {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s %q is not a number of milliseconds", timeoutHeader, v))
		}
	}
	sr := agent.StartRequest{
		ExecRequest: agent.ExecRequest{
			Cmd:       append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
			Env:       env,
			User:      acct.name,
			Workdir:   workdir,
			TimeoutMs: timeoutMs,
			Tag:       req.Msg.GetTag(),
		},
		// Absent means a stdin, as for E2B's older SDKs.
		Stdin: req.Msg.Stdin == nil || req.Msg.GetStdin(),
	}
	if p := req.Msg.Pty; p != nil {
		sr.Pty = &agent.PtySize{Cols: int(p.GetSize().GetCols()), Rows: int(p.GetSize().GetRows())}
	}
	p, err := ep.s.startIO(sr, maps.Clone(cfg.GetEnvs()))
	if err != nil {
		return connectError(err)
	}
	return ep.follow(ctx, req.Header(), p, 0, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

func (ep *envdProcess) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := ep.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	// E2B's Connect streams what comes from now on.
	return ep.follow(ctx, req.Header(), p, p.out.from(-1).next, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

// follow streams p's events from output offset off: start, data,
// keepalives when idle, end. The client leaving ends only the stream.
func (ep *envdProcess) follow(ctx context.Context, h http.Header, p *procIO, off int64, send func(*pb.ProcessEvent) error) error {
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}); err != nil {
		return err
	}
	ka := time.NewTicker(ep.e.keepaliveEvery(h))
	defer ka.Stop()
	for {
		v := p.out.from(off)
		for _, c := range v.chunks {
			d := &pb.ProcessEvent_DataEvent{}
			switch c.stream {
			case "pty":
				d.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: c.data}
			case "stderr":
				d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: c.data}
			default:
				d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: c.data}
			}
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}); err != nil {
				return err
			}
		}
		off = v.next
		if v.exit != nil {
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: endEvent(p.status, *v.exit, v.errMsg)}})
		}
		select {
		case <-v.wake:
		case <-ka.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// endEvent describes an exit as E2B's envd does (Go's os.ProcessState):
// a signalled process has exit code -1, exited false, "signal: killed".
func endEvent(ws syscall.WaitStatus, code int, errMsg string) *pb.ProcessEvent_EndEvent {
	end := &pb.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: ws.Exited()}
	switch {
	case ws.Exited():
		end.Status = fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		end.ExitCode = -1
		end.Status = "signal: " + ws.Signal().String()
	}
	if errMsg != "" {
		end.Error = &errMsg
	}
	return end
}

// find resolves a selector to an interactive process.
func (ep *envdProcess) find(sel *pb.ProcessSelector) (*procIO, error) {
	switch {
	case sel == nil:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is required"))
	case sel.GetTag() != "":
		for _, pr := range ep.s.procs.list() {
			if pr.Tag == sel.GetTag() {
				return ep.io(pr.Pid)
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no process with tag %q", sel.GetTag()))
	}
	return ep.io(int(sel.GetPid()))
}

func (ep *envdProcess) io(pid int) (*procIO, error) {
	p, err := ep.s.ios.get(pid)
	if err != nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", pid))
	}
	return p, nil
}

// List is the running processes, each with its config as started: for
// envd's, the envs its Start asked for (as E2B's envd, not the sandbox's
// envs beneath them).
func (ep *envdProcess) List(context.Context, *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	procs := ep.s.procs.list()
	out := &pb.ListResponse{Processes: make([]*pb.ProcessInfo, 0, len(procs))}
	for _, pr := range procs {
		info := &pb.ProcessInfo{Pid: uint32(pr.Pid), Config: &pb.ProcessConfig{Cwd: &pr.Cwd}}
		if p, err := ep.s.ios.get(pr.Pid); err == nil {
			info.Config.Envs = p.configEnv
		}
		if len(pr.Cmd) > 0 {
			info.Config.Cmd, info.Config.Args = pr.Cmd[0], pr.Cmd[1:]
		}
		if pr.Tag != "" {
			info.Tag = &pr.Tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

func (ep *envdProcess) input(sel *pb.ProcessSelector, in *pb.ProcessInput) error {
	p, err := ep.find(sel)
	if err != nil {
		return err
	}
	data := in.GetStdin()
	if in.GetPty() != nil {
		data = in.GetPty()
	}
	return connectError(p.write(data))
}

func (ep *envdProcess) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	if err := ep.input(req.Msg.GetProcess(), req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (ep *envdProcess) StreamInput(_ context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var sel *pb.ProcessSelector
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *pb.StreamInputRequest_Start:
			sel = ev.Start.GetProcess()
		case *pb.StreamInputRequest_Data:
			if sel == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("data before the start event"))
			}
			if err := ep.input(sel, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (ep *envdProcess) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v is not SIGKILL or SIGTERM", req.Msg.GetSignal()))
	}
	p, err := ep.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := ep.s.signalPID(p.pid, sig); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (ep *envdProcess) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ep.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.closeStdin(); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (ep *envdProcess) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ep.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		if err := p.resize(int(sz.GetCols()), int(sz.GetRows())); err != nil {
			return nil, connectError(err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}
