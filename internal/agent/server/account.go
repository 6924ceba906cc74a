package server

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// account is a sandbox user as commands and file operations run as it.
type account struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32
	home   string
	shell  string
	// tmp, if not "", is the account's TMPDIR: on the host (hostAccount),
	// the sandbox's own temporary directory, as /tmp is in a sandbox.
	tmp string
}

const defaultShell = "/bin/sh"

// rootAccount stands in for root in images without /etc/passwd.
var rootAccount = account{name: "root", home: "/root", shell: defaultShell}

// accounts resolves user names. host, when not nil, is the account that
// stands for root: the agent runs on the host as an ordinary process (see
// Config.Home), not as a sandbox's PID 1.
type accounts struct {
	host *account
}

// hostAccount is the agent's own user with home as its home directory and
// home/.tmp as its TMPDIR (made if missing), since the host's /tmp is not
// the sandbox's.
func hostAccount(home string) (*account, error) {
	u, err := user.Current()
	if err != nil {
		return nil, fmt.Errorf("looking up the agent's user: %w", err)
	}
	tmp := filepath.Join(home, ".tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("the sandbox's temporary directory: %w", err)
	}
	return &account{
		name:   u.Username,
		uid:    uint32(os.Geteuid()),
		gid:    uint32(os.Getegid()),
		groups: groupIDs(u, uint32(os.Getegid())),
		home:   home,
		shell:  defaultShell,
		tmp:    tmp,
	}, nil
}

// lookupAccount resolves a user name from the sandbox's /etc/passwd and
// /etc/group; "" means root. The agent is built with CGO_ENABLED=0, so
// os/user reads those files itself rather than asking NSS. A user the
// sandbox does not have is invalid input.
func (as accounts) lookupAccount(name string) (*account, error) {
	a, err := as.findAccount(name)
	if err == nil && a == nil {
		return nil, errInvalid("unknown user %q: not in the sandbox's /etc/passwd", name)
	}
	return a, err
}

// findAccount is lookupAccount for a user the sandbox may lack: nil and no
// error when it has no such user. Root always exists (rootAccount stands
// in when /etc/passwd cannot tell).
func (as accounts) findAccount(name string) (*account, error) {
	if name == "" {
		name = "root"
	}
	if name == "root" && as.host != nil {
		a := *as.host
		return &a, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		if name == "root" {
			a := rootAccount
			return &a, nil
		}
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) || errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("looking up user %q: %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %q has a non-numeric uid %q or gid %q", name, u.Uid, u.Gid)
	}
	a := &account{
		name:   u.Username,
		uid:    uint32(uid),
		gid:    uint32(gid),
		groups: groupIDs(u, uint32(gid)),
		home:   u.HomeDir,
		shell:  loginShell(u.Username),
	}
	return a, nil
}

// groupIDs returns the user's supplementary groups, falling back to the
// primary group alone when /etc/group cannot be read.
func groupIDs(u *user.User, primary uint32) []uint32 {
	ids, err := u.GroupIds()
	if err != nil {
		return []uint32{primary}
	}
	out := make([]uint32, 0, len(ids))
	for _, s := range ids {
		if g, err := strconv.ParseUint(s, 10, 32); err == nil {
			out = append(out, uint32(g))
		}
	}
	return out
}

// loginShell returns the shell field of name's /etc/passwd entry (os/user
// does not expose it), or /bin/sh.
func loginShell(name string) string {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return defaultShell
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) == 7 && fields[0] == name && fields[6] != "" {
			return fields[6]
		}
	}
	return defaultShell
}

// credential is the SysProcAttr credential that runs a child as a, or nil
// when the agent already is a.
func (a *account) credential() *syscall.Credential {
	if int(a.uid) == os.Geteuid() && int(a.gid) == os.Getegid() {
		return nil
	}
	return &syscall.Credential{Uid: a.uid, Gid: a.gid, Groups: a.groups}
}

// isRoot says whether file operations for a can run in the agent itself:
// a is root, or the agent's own user.
func (a *account) isRoot() bool { return a.uid == 0 || a.credential() == nil }

// mayList says whether a could list and enter the directory st describes,
// judged by its owner, group and mode bits alone (no ACLs): the agent, as
// root, uses it to keep a user's recursive watch out of directories the
// user could not read.
func (a *account) mayList(st *syscall.Stat_t) bool {
	if a.uid == 0 {
		return true
	}
	bits := st.Mode
	switch {
	case st.Uid == a.uid:
		bits >>= 6
	case st.Gid == a.gid || slices.Contains(a.groups, st.Gid):
		bits >>= 3
	}
	const readSearch = 0o5
	return bits&readSearch == readSearch
}
