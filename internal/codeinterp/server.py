"""lizard's code-interpreter server: the API of E2B's code interpreter
(@e2b/code-interpreter) on port 49999, on Jupyter kernels.

Shipped inside the lizard binary and bind-mounted read-only into sandboxes
(never part of a template's rootfs); the template code-interpreter-v1 starts
it as its start command, so the server and its default Python kernel are
already running in the template's ready state.

Routes:
  GET    /health                  200 once the default kernel is ready
  POST   /execute                 {code, context_id?, language?, env_vars?} -> NDJSON stream
  POST   /contexts                {language?, cwd?} -> {id, language, cwd}
  GET    /contexts                [{id, language, cwd}, ...]
  POST   /contexts/{id}/restart
  DELETE /contexts/{id}

Only /execute checks X-Access-Token, and only once a token file exists.
Python runs on Jupyter kernels, reached over ZeroMQ's ipc transport (Unix
sockets); JavaScript (node) and bash run in runners of our own, a node or
bash process per context driven over its stdin (ProcessContext), since the
template has no Jupyter kernel for them. Each is started once and kept:
nothing is imported per request. The sandbox's environment variables
(envd's GET /envs) reach every context before each execution.
"""

import argparse
import asyncio
import datetime
import hmac
import json
import logging
import os
import queue
import re
import shlex
import shutil
import signal
import sys
import uuid

import tornado.httpclient
import tornado.httpserver
import tornado.iostream
import tornado.web
from jupyter_client.manager import AsyncKernelManager

log = logging.getLogger("code-interpreter")

# E2B language names -> Jupyter kernel spec names. Only kernels the image has
# are offered; see available_languages.
KERNELS = {"python": "python3"}
# Languages run by a runner of our own -> the program it needs.
RUNNERS = {"javascript": "node", "bash": "bash"}
LANGUAGE_ALIASES = {"python3": "python", "py": "python",
                    "js": "javascript", "node": "javascript", "nodejs": "javascript",
                    "sh": "bash", "shell": "bash"}
# Where the envd of the sandbox answers GET /envs (the agent, on its port).
ENVD_ENVS_URL = "http://127.0.0.1:49983/envs"

# MIME types of a display bundle -> the fields the SDKs read. Other MIME types
# are passed under their own name (the JS SDK gathers those in Result.extra).
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Run silently in every new Python kernel: matplotlib figures become inline
# PNG results, DataFrames also get an "e2b/data" representation, the heavy
# libraries are loaded now (not at the first cell), and _lizard_ci holds the
# per-execution environment helpers outside the user's namespace.
PYTHON_SETUP = r"""
%matplotlib inline
def _lizard_setup():
    import json, os, sys, types
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, list)

    ip = get_ipython()
    f = DataFormatter(parent=ip.display_formatter)
    f.for_type_by_name("pandas.core.frame", "DataFrame",
                       lambda df: json.loads(df.to_json(orient="split", date_format="iso")))
    ip.display_formatter.formatters["e2b/data"] = f

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

    m = types.ModuleType("_lizard_ci")
    exec(__CHART_SRC__, m.__dict__)

    def chart_of(fig):
        try:
            return m._lizard_chart(fig)
        except Exception:
            return None
    c = ChartFormatter(parent=ip.display_formatter)
    c.for_type_by_name("matplotlib.figure", "Figure", chart_of)
    ip.display_formatter.formatters["e2b/chart"] = c

    m.base = {}
    def set_base_env(env):
        for k in m.base:
            if k not in env:
                os.environ.pop(k, None)
        os.environ.update(env)
        m.base = dict(env)
    m.set_base_env = set_base_env
    m.saved = []
    def set_env(env):
        m.saved.append({k: os.environ.get(k) for k in env})
        os.environ.update(env)
    def restore_env():
        for k, v in m.saved.pop().items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    m.set_env, m.restore_env = set_env, restore_env
    sys.modules["_lizard_ci"] = m
    for name in ("numpy", "pandas", "matplotlib.pyplot"):
        try:
            __import__(name)
        except Exception:
            pass
_lizard_setup()
del _lizard_setup
"""

# The chart of a matplotlib figure, as @e2b/code-interpreter's Result.chart
# reads it: {type, title, elements, ...} for one axes (line, scatter, bar,
# pie; anything else is "unknown"), a "superchart" of them for several.
# PYTHON_SETUP defines it in the kernel's _lizard_ci module, outside the
# user's namespace.
PYTHON_CHART = r"""
def _lizard_chart(fig):
    import datetime
    import matplotlib.dates as mdates
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    def plain(v):
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, (datetime.date, datetime.datetime)):
            return v.isoformat()
        if isinstance(v, float) and v != v:
            return None
        return v

    def text(t):
        return t.get_text() if t is not None else ""

    def axis2d(ax, kind):
        out = {"type": kind, "title": ax.get_title(), "x_label": ax.get_xlabel(),
               "y_label": ax.get_ylabel(), "elements": []}
        for a in ("x", "y"):
            axis = getattr(ax, a + "axis")
            scale = axis.get_scale()
            conv = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
            dates = isinstance(conv, mdates.DateConverter) or type(conv).__name__ == "_SwitchableDateConverter"
            ticks = [plain(t) for t in axis.get_ticklocs()]
            if dates:
                scale = "datetime"
                ticks = [mdates.num2date(t).isoformat() for t in ticks]
            out[a + "_scale"] = scale
            out[a + "_ticks"] = ticks
            out[a + "_tick_labels"] = [text(t) for t in axis.get_ticklabels()]
        return out, out["x_scale"] == "datetime"

    def points(xs, ys, dates):
        conv = (lambda x: mdates.num2date(x).isoformat()) if dates else plain
        return [[conv(x), plain(y)] for x, y in zip(xs, ys)]

    def one(ax):
        wedges = [p for p in ax.patches if isinstance(p, Wedge)]
        if wedges:
            return {"type": "pie", "title": ax.get_title(), "elements": [
                {"label": w.get_label(), "angle": plain(abs(w.theta2 - w.theta1)), "radius": plain(w.r)}
                for w in wedges]}
        bars = [c for c in ax.containers if isinstance(c, BarContainer)]
        if bars:
            out, _ = axis2d(ax, "bar")
            vertical = getattr(bars[0], "orientation", "vertical") != "horizontal"
            labels = {round(t, 6): l for t, l in zip(
                (ax.get_xticks() if vertical else ax.get_yticks()),
                out["x_tick_labels" if vertical else "y_tick_labels"])}
            for i, c in enumerate(bars):
                group = c.get_label()
                if not group or group.startswith("_"):
                    group = str(i)
                for r in c.patches:
                    at = r.get_x() + r.get_width() / 2 if vertical else r.get_y() + r.get_height() / 2
                    value = r.get_height() if vertical else r.get_width()
                    label = labels.get(round(at, 6)) or str(plain(at))
                    out["elements"].append({"label": label, "value": plain(value), "group": group})
            return out
        lines = [l for l in ax.get_lines() if not l.get_label().startswith("_child") or len(l.get_xdata())]
        scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
        if scatters and not lines:
            out, dates = axis2d(ax, "scatter")
            for i, c in enumerate(scatters):
                offs = c.get_offsets()
                out["elements"].append({"label": c.get_label() if not c.get_label().startswith("_") else str(i),
                                        "points": points(offs[:, 0], offs[:, 1], dates)})
            return out
        if lines:
            out, dates = axis2d(ax, "line")
            for i, l in enumerate(lines):
                label = l.get_label()
                out["elements"].append({"label": label if not label.startswith("_") else str(i),
                                        "points": points(l.get_xdata(), l.get_ydata(), dates)})
            return out
        return {"type": "unknown", "title": ax.get_title(), "elements": []}

    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    if not axes:
        return None
    if len(axes) == 1:
        return one(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    return {"type": "superchart", "title": title, "elements": [one(ax) for ax in axes]}
"""

# The runner of a JavaScript context: a node process that reads one JSON
# request a line ({code, env, nonce}) and runs it in its global scope, so
# declarations persist from one execution to the next. Output is the
# process's own stdout and stderr; after each execution it writes an end
# marker to both, the one on stdout carrying the outcome (the main result's
# text, or the error).
JS_RUNNER = r"""
const vm = require('vm'), util = require('util'), readline = require('readline')
globalThis.require = require
globalThis.module = module
const end = (nonce, outcome) => {
  process.stderr.write('\0LZ:' + nonce + '\n')
  process.stdout.write('\0LZ:' + nonce + ':' + JSON.stringify(outcome) + '\n')
}
let base = {}
const run = async (req) => {
  // The sandbox's environment stays; a call's own goes over it for the call.
  for (const k of Object.keys(base)) if (!(k in req.base)) delete process.env[k]
  Object.assign(process.env, req.base)
  base = req.base
  const saved = {}
  for (const [k, v] of Object.entries(req.env || {})) { saved[k] = process.env[k]; process.env[k] = v }
  try {
    let value
    try {
      value = vm.runInThisContext(req.code, { filename: 'cell', breakOnSigint: true })
    } catch (e) {
      // Top-level await: run the cell as the body of an async function
      // (its declarations stay inside it), whose value is the last line's
      // when that line is an expression.
      if (!(e instanceof SyntaxError) || !/\bawait\b/.test(req.code)) throw e
      const lines = req.code.trimEnd().split('\n')
      const last = lines.pop().replace(/;\s*$/, '')
      const wrap = (body) => '(async () => {\n' + body + '\n})()'
      let src = wrap(lines.concat('return (' + last + '\n)').join('\n'))
      try { new vm.Script(src) } catch { src = wrap(req.code) }
      value = vm.runInThisContext(src, { filename: 'cell', breakOnSigint: true })
    }
    if (value instanceof Promise) value = await value
    return { result: value === undefined ? null : { text: typeof value === 'string' ? util.inspect(value) : util.inspect(value, { depth: 4 }) } }
  } catch (e) {
    const err = e instanceof Error ? e : new Error(String(e))
    return { error: { name: err.name || 'Error', value: err.message || String(e), traceback: err.stack || String(e) } }
  } finally {
    for (const [k, v] of Object.entries(saved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v }
  }
}
let queue = Promise.resolve()
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const req = JSON.parse(line)
  queue = queue.then(async () => end(req.nonce, await run(req)))
})
"""


class HTTPError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def available_languages():
    from jupyter_client.kernelspec import KernelSpecManager
    specs = KernelSpecManager().find_kernel_specs()
    langs = {lang for lang, spec in KERNELS.items() if spec in specs}
    return langs | {lang for lang, prog in RUNNERS.items() if shutil.which(prog)}


def to_result(content, main):
    out = {"type": "result", "is_main_result": main}
    for mime, value in content.get("data", {}).items():
        out[MIME_FIELDS.get(mime, mime)] = value
    return out


class Context:
    """What every context has: an id, a language, a cwd, one execution at a
    time, and the sandbox's environment it last applied."""

    def __init__(self, language, cwd, sockdir):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.sockdir = sockdir
        self.lock = asyncio.Lock()
        self.base_env = {}

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def restart(self):
        async with self.lock:
            await self.stop()
            await self.start()


class JupyterContext(Context):
    """A Jupyter kernel and its client."""

    def __init__(self, language, cwd, sockdir):
        super().__init__(language, cwd, sockdir)
        self.km = None
        self.kc = None

    async def start(self):
        self.base_env = {}
        self.km = AsyncKernelManager(kernel_name=KERNELS[self.language], transport="ipc",
                                     ip=os.path.join(self.sockdir, self.id))
        await self.km.start_kernel(cwd=self.cwd)
        try:
            self.kc = self.km.client()
            # No heartbeat channel: a ready state restored much later must
            # not look like a dead kernel.
            self.kc.start_channels(hb=False)
            await self.kc.wait_for_ready(timeout=120)
            if self.language == "python":
                if not await self.run_silent(PYTHON_SETUP.replace("__CHART_SRC__", repr(PYTHON_CHART))):
                    raise RuntimeError("kernel setup failed")
        except BaseException:
            await self.stop()
            raise

    async def stop(self):
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        if self.km is not None:
            try:
                await self.km.shutdown_kernel(now=True)
            except Exception as e:
                log.warning("shutdown kernel %s: %s", self.id, e)
            self.km = None

    async def run_silent(self, code):
        """Runs code without output or history; reports whether it succeeded."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        ok = True
        async for msg in self.messages(msg_id, lambda: False):
            if msg["msg_type"] == "error":
                log.warning("silent execution failed: %s: %s", msg["content"].get("ename"),
                            msg["content"].get("evalue"))
                ok = False
        return ok

    async def messages(self, msg_id, gone):
        """Yields the IOPub messages of request msg_id until the kernel is
        idle again, then reads its shell reply. gone() true means the client
        left: the execution is interrupted once, and its messages drained."""
        interrupted = False
        while True:
            if gone() and not interrupted:
                interrupted = True
                await self.km.interrupt_kernel()
            try:
                msg = await self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                if not await self.km.is_alive():
                    raise RuntimeError("the kernel died")
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                break
            yield msg
        while True:
            try:
                reply = await self.kc.get_shell_msg(timeout=10)
            except queue.Empty:
                return
            if reply["parent_header"].get("msg_id") == msg_id:
                return

    async def execute(self, code, base_env, env, emit, gone):
        async with self.lock:
            if self.kc is None:
                raise HTTPError(503, "context %s is not running" % self.id)
            if base_env != self.base_env:
                if not await self.run_silent("__import__('_lizard_ci').set_base_env(%r)" % (base_env,)):
                    raise RuntimeError("setting the sandbox's environment failed")
                self.base_env = base_env
            if env:
                await self.run_silent("__import__('_lizard_ci').set_env(%r)" % (env,))
            try:
                msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
                async for msg in self.messages(msg_id, gone):
                    out = message_event(msg)
                    if out is not None and not gone():
                        await emit(out)
            finally:
                if env:
                    await self.run_silent("__import__('_lizard_ci').restore_env()")


class MarkedStream:
    """Reads a runner's stdout or stderr: text up to the end marker of an
    execution ("\\0LZ:<nonce>" and, on stdout, ":<outcome JSON>", then a
    newline) is output; the marker ends the execution's part of the stream."""

    def __init__(self, reader):
        self.reader = reader
        self.buf = b""

    async def until(self, nonce, on_text):
        """Passes text to on_text until the marker of nonce; returns what
        followed the nonce in the marker (b"" on stderr). A stream that ends
        first means the runner died."""
        marker = b"\0LZ:" + nonce.encode()
        while True:
            i = self.buf.find(marker)
            if i >= 0:
                j = self.buf.find(b"\n", i)
                if j >= 0:
                    await self.text(self.buf[:i], on_text)
                    rest = self.buf[i + len(marker):j]
                    self.buf = self.buf[j + 1:]
                    return rest
            else:
                # Hold back only what could be the start of a marker.
                k = self.buf.rfind(b"\0")
                keep = k if k >= 0 and marker.startswith(self.buf[k:k + len(marker)]) else len(self.buf)
                await self.text(self.buf[:keep], on_text)
                self.buf = self.buf[keep:]
            chunk = await self.reader.read(65536)
            if not chunk:
                raise RuntimeError("the context's runner ended")
            self.buf += chunk

    async def text(self, b, on_text):
        # Hold back an incomplete UTF-8 sequence at the end.
        if not b:
            return
        cut = len(b)
        for n in range(1, min(4, len(b)) + 1):
            c = b[-n]
            if c & 0xC0 == 0x80:
                continue
            if c >= 0xC0 and n < (2 if c < 0xE0 else 3 if c < 0xF0 else 4):
                cut = len(b) - n
            break
        if cut < len(b):
            self.buf = b[cut:] + self.buf
            b = b[:cut]
        if b:
            await on_text(b.decode("utf-8", "replace"))


class ProcessContext(Context):
    """A JavaScript or bash context of our own: one node or bash process,
    kept for the context's life, that runs each execution in the same
    global state. An execution's output is what the process writes to its
    stdout and stderr until its end marker (MarkedStream)."""

    def __init__(self, language, cwd, sockdir):
        super().__init__(language, cwd, sockdir)
        self.proc = None
        self.out = self.err = None
        self.count = 0

    async def start(self):
        self.base_env = {}
        if self.language == "javascript":
            argv = ["node", "-e", JS_RUNNER]
        else:
            argv = ["bash", "--noprofile", "--norc"]
        self.proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=self.cwd, start_new_session=True)
        self.out, self.err = MarkedStream(self.proc.stdout), MarkedStream(self.proc.stderr)
        self.count = 0

    async def stop(self):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await self.proc.wait()
        self.proc = None

    def request(self, code, base_env, env, nonce):
        if self.language == "javascript":
            # The sandbox's environment stays; a call's goes after it.
            return (json.dumps({"code": code, "env": env, "base": base_env, "nonce": nonce}) + "\n").encode()
        lines = []
        for k in self.base_env:
            if k not in base_env:
                lines.append("unset %s" % k)
        for k, v in base_env.items():
            lines.append("export %s=%s" % (k, shlex.quote(v)))
        delim = "LZ_" + nonce
        prefix = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in env.items())
        # The code is a quoted here-document, read into a variable and
        # eval'd in this shell (cd, variables and functions persist); with
        # assignments before it, eval sees them only for this call. stdin
        # is not the code's: it is ours.
        lines += [
            "__lz_code=$(cat <<'%s'" % delim, code, delim, ")",
            "{ %s eval \"$__lz_code\"; } </dev/null" % prefix,
            "__lz_rc=$?",
            "printf '\\0LZ:%s\\n' >&2" % nonce,
            "printf '\\0LZ:%s:{\"exit\": %%d}\\n' \"$__lz_rc\"" % nonce,
        ]
        return ("\n".join(lines) + "\n").encode()

    async def execute(self, code, base_env, env, emit, gone):
        async with self.lock:
            if self.proc is None or self.proc.returncode is not None:
                # exit, or an interrupt, ended the last one: a fresh start.
                await self.stop()
                await self.start()
            nonce = uuid.uuid4().hex
            self.count += 1
            await emit({"type": "number_of_executions", "execution_count": self.count})
            req = self.request(code, base_env, env, nonce)
            try:
                self.proc.stdin.write(req)
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                await self.stop()
                raise RuntimeError("the context's runner ended")
            self.base_env = base_env

            async def out(t):
                if not gone():
                    await emit({"type": "stdout", "text": t, "timestamp": now()})

            async def err(t):
                if not gone():
                    await emit({"type": "stderr", "text": t, "timestamp": now()})

            watch = asyncio.ensure_future(self.interrupt_when(gone))
            try:
                outcome, _ = await asyncio.gather(self.out.until(nonce, out), self.err.until(nonce, err))
            except BaseException:
                # Whatever cut the execution short, its streams are not at a
                # marker any more: the next execution gets a fresh runner.
                await self.stop()
                raise
            finally:
                watch.cancel()
            o = json.loads(outcome.lstrip(b":") or b"{}")
            if gone():
                return
            if o.get("result"):
                await emit({"type": "result", "is_main_result": True, **o["result"]})
            if o.get("error"):
                await emit({"type": "error", **o["error"]})
            if o.get("exit"):
                await emit({"type": "error", "name": "ExitError", "value": "exit status %d" % o["exit"],
                            "traceback": ""})

    async def interrupt_when(self, gone):
        """Interrupts the execution once the client has left (SIGINT to the
        runner's process group)."""
        while not gone():
            await asyncio.sleep(0.5)
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except (ProcessLookupError, AttributeError):
            pass


def message_event(msg):
    """The NDJSON event of one IOPub message, or None."""
    t, c = msg["msg_type"], msg["content"]
    if t == "stream":
        return {"type": "stderr" if c.get("name") == "stderr" else "stdout",
                "text": c.get("text", ""), "timestamp": now()}
    if t == "execute_input":
        return {"type": "number_of_executions", "execution_count": c.get("execution_count")}
    if t == "execute_result":
        return to_result(c, True)
    if t == "display_data":
        return to_result(c, False)
    if t == "error":
        return {"type": "error", "name": c.get("ename", ""), "value": c.get("evalue", ""),
                "traceback": "\n".join(c.get("traceback", []))}
    return None


class Interpreter:
    """The contexts, and the default one of each language."""

    def __init__(self, sockdir, default_cwd, token_file):
        self.sockdir = sockdir
        self.default_cwd = default_cwd
        self.token_file = token_file
        self.languages = available_languages()
        self.contexts = {}
        self.defaults = {}
        self.ready = False
        self.starting = {}

    def language(self, name):
        lang = LANGUAGE_ALIASES.get((name or "python").lower(), (name or "python").lower())
        if lang in ("typescript", "ts"):
            raise HTTPError(400, "language %r is not supported here: the JavaScript context runs "
                            "plain JavaScript on node, without TypeScript (supported: %s)"
                            % (name, ", ".join(sorted(self.languages))))
        if lang not in self.languages:
            raise HTTPError(400, "language %r is not supported here (supported: %s)"
                            % (name, ", ".join(sorted(self.languages))))
        return lang

    async def create(self, language, cwd):
        cwd = cwd or self.default_cwd
        if not os.path.isabs(cwd) or not os.path.isdir(cwd):
            raise HTTPError(400, "cwd %r is not an existing absolute directory" % cwd)
        kind = JupyterContext if language in KERNELS else ProcessContext
        ctx = kind(language, cwd, self.sockdir)
        await ctx.start()
        self.contexts[ctx.id] = ctx
        return ctx

    async def default(self, language):
        ctx = self.contexts.get(self.defaults.get(language))
        if ctx is not None:
            return ctx
        # One start per language at a time, however many callers wait.
        fut = self.starting.get(language)
        if fut is None:
            fut = asyncio.ensure_future(self.create(language, None))
            self.starting[language] = fut
            try:
                ctx = await fut
                self.defaults[language] = ctx.id
            finally:
                del self.starting[language]
            return ctx
        return await asyncio.shield(fut)

    def get(self, ctx_id):
        ctx = self.contexts.get(ctx_id)
        if ctx is None:
            raise HTTPError(404, "context %s not found" % ctx_id)
        return ctx

    async def remove(self, ctx_id):
        ctx = self.get(ctx_id)
        del self.contexts[ctx_id]
        async with ctx.lock:
            await ctx.stop()

    async def sandbox_env(self):
        """The sandbox's environment variables, as envd has them (the
        create-time envs): asked at each execution, since a ready state's
        server wakes up in sandboxes made with other envs."""
        headers = {"X-Lizard-Envd": "1"}
        tok = self.token()
        if tok:
            headers["X-Access-Token"] = tok
        try:
            resp = await tornado.httpclient.AsyncHTTPClient().fetch(ENVD_ENVS_URL, headers=headers,
                                                                    request_timeout=10)
            env = json.loads(resp.body)
        except Exception as e:
            raise HTTPError(503, "reading the sandbox's environment from envd: %s" % e)
        return {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)}

    def token(self):
        try:
            with open(self.token_file) as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""

    async def close(self):
        for ctx in list(self.contexts.values()):
            await ctx.stop()


class Handler(tornado.web.RequestHandler):
    def initialize(self, interp):
        self.interp = interp

    def body(self):
        if not self.request.body:
            return {}
        try:
            b = json.loads(self.request.body)
        except ValueError as e:
            raise HTTPError(400, "body is not JSON: %s" % e)
        if not isinstance(b, dict):
            raise HTTPError(400, "body must be a JSON object")
        return b

    def fail(self, status, message):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"code": status, "message": message}))

    def write_json(self, obj):
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    async def guarded(self, fn, *args):
        try:
            await fn(*args)
        except HTTPError as e:
            if not self._headers_written:
                self.fail(e.status, e.message)
        except tornado.iostream.StreamClosedError:
            pass
        except Exception as e:
            log.exception("%s %s", self.request.method, self.request.path)
            if not self._headers_written:
                self.fail(500, str(e))


def string_field(body, name):
    v = body.get(name)
    if v is not None and not isinstance(v, str):
        raise HTTPError(400, "%s must be a string" % name)
    return v


class Health(Handler):
    def get(self):
        if not self.interp.ready:
            return self.fail(503, "starting")
        self.write_json({"status": "ok"})


class Execute(Handler):
    def on_connection_close(self):
        self.closed = True

    async def post(self):
        self.closed = False
        await self.guarded(self.run)

    async def run(self):
        want = self.interp.token()
        if want and not hmac.compare_digest(self.request.headers.get("X-Access-Token", "").encode(), want.encode()):
            raise HTTPError(401, "invalid or missing X-Access-Token")
        b = self.body()
        code = b.get("code")
        if not isinstance(code, str):
            raise HTTPError(400, "code must be a string")
        ctx_id = string_field(b, "context_id")
        language = string_field(b, "language")
        if ctx_id and language:
            raise HTTPError(400, "give context_id or language, not both")
        env = b.get("env_vars") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and k and "=" not in k and "\0" not in k
                                                and isinstance(v, str) and "\0" not in v
                                                for k, v in env.items()):
            raise HTTPError(400, "env_vars must be an object of string values with non-empty names without '='")
        ctx = self.interp.get(ctx_id) if ctx_id else None
        lang = ctx.language if ctx else self.interp.language(language)
        base_env = await self.interp.sandbox_env()
        if lang == "bash":
            # bash cannot set names that are not identifiers: the sandbox's
            # are left out, a call's are refused (before any context starts).
            base_env = {k: v for k, v in base_env.items() if ENV_NAME.match(k)}
            for k in env:
                if not ENV_NAME.match(k):
                    raise HTTPError(400, "env_vars: %r is not a name bash can export" % k)
        if ctx is None:
            ctx = await self.interp.default(lang)

        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Accel-Buffering", "no")

        async def emit(ev):
            self.write(json.dumps(ev) + "\n")
            await self.flush()

        try:
            await ctx.execute(code, base_env, env, emit, lambda: self.closed)
        except RuntimeError as e:
            if self.closed:
                return
            await emit({"type": "unexpected_end_of_execution", "message": str(e)})
            return
        if not self.closed:
            await emit({"type": "end_of_execution"})
            self.finish()


class Contexts(Handler):
    async def get(self):
        self.write_json([c.info() for c in self.interp.contexts.values()])

    async def post(self):
        async def create():
            b = self.body()
            lang = self.interp.language(string_field(b, "language"))
            ctx = await self.interp.create(lang, string_field(b, "cwd"))
            self.write_json(ctx.info())
        await self.guarded(create)


class ContextOne(Handler):
    async def delete(self, ctx_id):
        async def remove():
            await self.interp.remove(ctx_id)
            self.set_status(204)
            self.finish()
        await self.guarded(remove)


class ContextRestart(Handler):
    async def post(self, ctx_id):
        async def restart():
            await self.interp.get(ctx_id).restart()
            self.set_status(204)
            self.finish()
        await self.guarded(restart)


def app(interp):
    a = {"interp": interp}
    return tornado.web.Application([
        (r"/health", Health, a),
        (r"/execute", Execute, a),
        (r"/contexts", Contexts, a),
        (r"/contexts/([^/]+)", ContextOne, a),
        (r"/contexts/([^/]+)/restart", ContextRestart, a),
    ])


async def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", default="0.0.0.0")
    p.add_argument("--port", type=int, default=49999)
    p.add_argument("--cwd", default="/home/user", help="default context's working directory (else /)")
    p.add_argument("--token-file", default="/run/lizard/envd-token",
                   help="X-Access-Token /execute requires, once this file exists")
    p.add_argument("--sock-dir", default="/run/lizard/code-interpreter")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    os.makedirs(args.sock_dir, mode=0o700, exist_ok=True)
    cwd = args.cwd if os.path.isdir(args.cwd) else "/"
    interp = Interpreter(args.sock_dir, cwd, args.token_file)
    server = tornado.httpserver.HTTPServer(app(interp), idle_connection_timeout=3600)
    server.listen(args.port, address=args.listen)
    log.info("listening on %s:%d (languages: %s)", args.listen, args.port, ", ".join(sorted(interp.languages)))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    try:
        if "python" in interp.languages:
            await interp.default("python")
        interp.ready = True
        log.info("ready")
        await stop.wait()
    finally:
        server.stop()
        await interp.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
