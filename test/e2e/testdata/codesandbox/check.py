"""Drives the Lizard Python SDK's CodeSandbox, unchanged, against the
server of the test (LIZARD_API_URL, LIZARD_API_KEY; TLS trusted through
SSL_CERT_FILE), and fails on the first thing that is not as it should be."""
import base64
import sys

from lizard.code_interpreter import CodeSandbox


def check(cond, what, got=None):
    if not cond:
        sys.exit("FAIL: %s: %r" % (what, got))


# 0.1.1's CodeSandbox.create() without a template asks for "base" (it
# reads Sandbox's _default_template, not its own _DEFAULT_TEMPLATE), which
# has no code interpreter: name the template, as its users must.
with CodeSandbox.create("code-interpreter-v1") as sbx:
    # State kept between calls; stdout and the value of the last line.
    sbx.run_code("x = 20")
    e = sbx.run_code("print('hello')\nx * 2 + 2")
    check(e.success and e.stdout == "hello\n", "stdout", e)
    check([(r.mime, r.data) for r in e.results if r.mime == "text/plain"] == [("text/plain", "42")], "result", e.results)
    check(e.execution_count >= 2, "execution count", e.execution_count)

    # A matplotlib chart comes as a PNG.
    e = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 4, 8])\nplt.title('growth')\nplt.show()")
    pngs = [r.data for r in e.results if r.mime == "image/png"]
    check(len(pngs) == 1 and base64.b64decode(pngs[0])[1:4] == b"PNG", "chart png", [r.mime for r in e.results])

    # An error: name, message, traceback; the kernel lives on.
    e = sbx.run_code("def f():\n    raise ValueError('bad input')\nf()")
    check(not e.success and e.error.name == "ValueError" and e.error.message == "bad input", "error", e.error and vars(e.error))
    check("raise ValueError" in e.error.traceback, "traceback", e.error.traceback)
    check(sbx.run_code("x").results[0].data == "20", "state after the error")

    # Contexts: their own state, listed, restarted, removed.
    ctx = sbx.create_context(cwd="/tmp")
    check(ctx.language == "python" and ctx.cwd == "/tmp", "context", ctx)
    check(sbx.run_code("import os; os.getcwd()", context=ctx).results[0].data == "/tmp", "context cwd")
    check(sbx.run_code("x", context=ctx).error.name == "NameError", "context isolation")
    sbx.run_code("y = 1", context=ctx)
    check(ctx.id in [c.id for c in sbx.list_contexts()], "listed")
    sbx.restart_context(ctx)
    check(sbx.run_code("y", context=ctx).error.name == "NameError", "restart clears state")
    sbx.delete_context(ctx)
    check(ctx.id not in [c.id for c in sbx.list_contexts()], "removed")

    # bash and JavaScript, each keeping its state too.
    sbx.run_code("N=7; cd /tmp", language="bash")
    e = sbx.run_code("echo $N $(pwd); exit 3", language="bash")
    check(e.stdout == "7 /tmp\n" and e.error is not None and e.error.name == "ExitError", "bash", (e.stdout, e.error and vars(e.error)))
    sbx.run_code("var total = 40", language="javascript")
    e = sbx.run_code("console.log('js'); total + 2", language="javascript")
    check(e.stdout == "js\n" and [r.data for r in e.results] == ["42"], "javascript", (e.stdout, e.results))
    e = sbx.run_code("JSON.parse('{')", language="javascript")
    check(e.error is not None and e.error.name == "SyntaxError", "javascript error", e.error and vars(e.error))

print("ok")
