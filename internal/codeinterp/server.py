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
Kernels are reached over ZeroMQ's ipc transport (Unix sockets), and each is
started once and kept: nothing is imported per request.
"""

import argparse
import asyncio
import datetime
import hmac
import json
import logging
import os
import queue
import signal
import sys
import uuid

import tornado.httpserver
import tornado.iostream
import tornado.web
from jupyter_client.manager import AsyncKernelManager

log = logging.getLogger("code-interpreter")

# E2B language names -> Jupyter kernel spec names. Only kernels the image has
# are offered; see available_languages.
KERNELS = {"python": "python3"}
LANGUAGE_ALIASES = {"python3": "python", "py": "python"}

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

    m = types.ModuleType("_lizard_ci")
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
    return {lang for lang, spec in KERNELS.items() if spec in specs}


def to_result(content, main):
    out = {"type": "result", "is_main_result": main}
    for mime, value in content.get("data", {}).items():
        out[MIME_FIELDS.get(mime, mime)] = value
    return out


class Context:
    """A Jupyter kernel and its client; one execution at a time."""

    def __init__(self, language, cwd, sockdir):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.sockdir = sockdir
        self.lock = asyncio.Lock()
        self.km = None
        self.kc = None

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def start(self):
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
                if not await self.run_silent(PYTHON_SETUP):
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

    async def restart(self):
        async with self.lock:
            await self.stop()
            await self.start()

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

    async def execute(self, code, env, emit, gone):
        async with self.lock:
            if self.kc is None:
                raise HTTPError(503, "context %s is not running" % self.id)
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
        if lang not in self.languages:
            raise HTTPError(400, "language %r is not supported here (supported: %s)"
                            % (name, ", ".join(sorted(self.languages))))
        return lang

    async def create(self, language, cwd):
        cwd = cwd or self.default_cwd
        if not os.path.isabs(cwd) or not os.path.isdir(cwd):
            raise HTTPError(400, "cwd %r is not an existing absolute directory" % cwd)
        ctx = Context(language, cwd, self.sockdir)
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
        ctx = self.interp.get(ctx_id) if ctx_id else await self.interp.default(self.interp.language(language))

        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Accel-Buffering", "no")

        async def emit(ev):
            self.write(json.dumps(ev) + "\n")
            await self.flush()

        try:
            await ctx.execute(code, env, emit, lambda: self.closed)
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
