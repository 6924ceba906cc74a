package schedule

import (
	"maps"
	"slices"
	"strings"
)

// agentCLI is a coding agent a prompt schedule runs non-interactively: its
// command (a shell script that reads the prompt, model and effort from the
// environment, never from its own text) and the built-in template that
// has it.
type agentCLI struct {
	template string
	// script runs the agent; $LIZARD_PROMPT, $LIZARD_MODEL and
	// $LIZARD_EFFORT hold what the schedule says ("" when it does not).
	script string
	env    map[string]string
}

// The agents, by the name a schedule's agent field gives.
var agents = map[string]agentCLI{
	// Claude Code in print mode: one answer on stdout. As root it asks
	// for IS_SANDBOX before it skips its permission prompts (nobody is
	// there to answer them). Its --effort has no "minimal": low is the
	// least.
	"claude": {
		template: "claude",
		script: `set -- -p "$LIZARD_PROMPT" --output-format text --dangerously-skip-permissions
[ -n "$LIZARD_MODEL" ] && set -- "$@" --model "$LIZARD_MODEL"
case "$LIZARD_EFFORT" in
"") ;;
minimal) set -- "$@" --effort low ;;
*) set -- "$@" --effort "$LIZARD_EFFORT" ;;
esac
exec claude "$@" </dev/null`,
		env: map[string]string{"IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"},
	},
	// Codex's exec mode: progress on stderr, the last message on stdout;
	// its reasoning efforts are the SDK's.
	"codex": {
		template: "codex",
		script: `set -- exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox --color never
[ -n "$LIZARD_MODEL" ] && set -- "$@" --model "$LIZARD_MODEL"
[ -n "$LIZARD_EFFORT" ] && set -- "$@" -c "model_reasoning_effort=\"$LIZARD_EFFORT\""
exec codex "$@" "$LIZARD_PROMPT" </dev/null`,
	},
}

// AgentNames are the agents a prompt schedule may name.
func AgentNames() []string { return slices.Sorted(maps.Keys(agents)) }

// DefaultAgent is the agent of a template ("" when it has none): the
// built-in claude and codex templates and templates named after them.
func DefaultAgent(template string) string {
	name := template
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	for a, cli := range agents {
		if name == cli.template || strings.HasPrefix(name, cli.template+"-") {
			return a
		}
	}
	return ""
}

// agentProbe is a command that exits 0 when the agent is on the PATH.
func agentProbe(agent string) string { return "command -v " + agent + " >/dev/null 2>&1" }
