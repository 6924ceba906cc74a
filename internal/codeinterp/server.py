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
Python and R run on Jupyter kernels (ipykernel, IRkernel), reached over
ZeroMQ's ipc transport (Unix sockets); JavaScript and TypeScript (node),
Java (JShell) and bash run in runners of our own, a process per context
driven over its stdin (ProcessContext), since Debian has no Jupyter kernel
for them. Each is started once and kept:
nothing is imported per request. The sandbox's environment variables
(envd's GET /envs) reach every context before each execution.
"""

import argparse
import asyncio
import base64
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

# E2B language names -> Jupyter kernel spec names (R's is IRkernel's, from
# Debian's r-cran-irkernel). Only kernels the image has are offered; see
# available_languages.
KERNELS = {"python": "python3", "r": "ir"}
# Languages run by a runner of our own -> the file the runner needs:
# TypeScript is transpiled by Debian's node-typescript and run by the
# JavaScript runner; Java runs in JShell (jdk.jshell, in a JDK).
RUNNERS = {"javascript": "node", "bash": "bash", "typescript": "/usr/share/nodejs/typescript/package.json",
           "java": "jshell"}
# The languages whose default context starts with the server, as E2B's
# server has python and javascript ones before any execution; the others
# (an R kernel or a JVM costs memory in every sandbox) start at their first
# use.
EAGER = ("python", "javascript", "bash")
LANGUAGE_ALIASES = {"python3": "python", "py": "python",
                    "js": "javascript", "node": "javascript", "nodejs": "javascript",
                    "ts": "typescript",
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

FIELD_MIMES = {field: mime for mime, field in MIME_FIELDS.items()}

ANSI_COLOR = re.compile(r"\x1b\[[0-9;]*m")

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
    # PIL images: saving one to a file shows it too, and show() shows it
    # here (there is no viewer in a sandbox); both become a PNG result.
    try:
        from IPython.display import display
        from PIL import Image
        save = Image.Image.save
        def save_and_show(self, fp, *args, **kwargs):
            if isinstance(fp, (str, os.PathLike)):
                display(self)
            return save(self, fp, *args, **kwargs)
        Image.Image.save = save_and_show
        Image.Image.show = lambda self, *args, **kwargs: display(self)
    except Exception:
        pass
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
# pie, box_and_whisker; anything else is "unknown"), a "superchart" of them
# for several. Absent titles, labels and units are null; datetime axes give
# ISO strings; an axis whose ticks are 0..n-1 labelled otherwise is
# "categorical". PYTHON_SETUP defines it in the kernel's _lizard_ci module,
# outside the user's namespace.
PYTHON_CHART = r"""
def _lizard_chart(fig):
    import datetime, math, re
    import matplotlib.dates as mdates
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge

    def plain(v):
        if hasattr(v, "dtype") and str(v.dtype).startswith("datetime64"):
            return str(v.astype("datetime64[s]"))
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, (datetime.date, datetime.datetime)):
            return v.isoformat()
        if isinstance(v, float) and v != v:
            return None
        return v

    def rounded(v, digits=10):
        # Float noise goes (a wedge's 323.9999914 is 324 to 6 digits).
        v = float(v)
        return v if not math.isfinite(v) or v == 0 else float("%.*g" % (digits, v))

    def none_if_empty(s):
        return s if s else None

    def unit(label):
        m = re.search(r"\s\(([^)]*)\)|\[([^\]]*)\]", label or "")
        return (m.group(1) if m.group(1) is not None else m.group(2)) if m else None

    def is_dates(axis):
        conv = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
        return isinstance(conv, mdates.DateConverter) or type(conv).__name__ in (
            "_SwitchableDateConverter", "ConciseDateConverter")

    def base(ax, kind):
        return {"type": kind, "title": none_if_empty(ax.get_title()), "elements": []}

    def planar(ax, kind):
        out = base(ax, kind)
        for a in ("x", "y"):
            label = none_if_empty(getattr(ax, "get_%slabel" % a)())
            out[a + "_label"], out[a + "_unit"] = label, unit(label)
        return out

    def swap(out):
        for f in ("label", "unit"):
            out["x_" + f], out["y_" + f] = out["y_" + f], out["x_" + f]

    def with_ticks(ax, out):
        for a in ("x", "y"):
            axis = getattr(ax, a + "axis")
            labels = [t.get_text() for t in axis.get_ticklabels()]
            locs = list(axis.get_ticklocs())
            if is_dates(axis):
                ticks, scale = [mdates.num2date(t).isoformat() for t in locs], "datetime"
            else:
                ticks = [float(t) if isinstance(plain(t), (int, float)) else plain(t) for t in locs]
                scale = axis.get_scale()
                if scale == "linear" and ticks and labels and all(
                        t == i and l != str(i) for i, (t, l) in enumerate(zip(ticks, labels))):
                    scale = "categorical"
            out[a + "_ticks"], out[a + "_tick_labels"], out[a + "_scale"] = ticks, labels, scale
        return out

    def straight(line):
        # Two points on a horizontal or vertical: a grid or reference line.
        xs, ys = line.get_xdata(), line.get_ydata()
        return len(xs) == 2 and len(ys) == 2 and (xs[0] == xs[1] or ys[0] == ys[1])

    def points(xs, ys):
        return [[plain(x), plain(y)] for x, y in zip(xs, ys)]

    def line_chart(ax):
        out = with_ticks(ax, planar(ax, "line"))
        for l in ax.get_lines():
            if straight(l):
                continue
            label = l.get_label()
            m = re.fullmatch(r"_child(\d+)", label)
            out["elements"].append({"label": "Line %s" % m.group(1) if m else label,
                                    "points": points(l.get_xdata(), l.get_ydata())})
        return out

    def scatter_chart(ax):
        out = with_ticks(ax, planar(ax, "scatter"))
        for c in ax.collections:
            offs = c.get_offsets()
            out["elements"].append({"label": c.get_label(), "points": points(offs[:, 0], offs[:, 1])})
        return out

    def pie_chart(ax):
        out = base(ax, "pie")
        for w in ax.patches:
            out["elements"].append({"label": w.get_label(), "angle": abs(rounded(w.theta2 - w.theta1, 6)),
                                    "radius": plain(w.r)})
        return out

    def bar_chart(ax):
        out = planar(ax, "bar")
        horizontal = False
        for i, c in enumerate(c for c in ax.containers if isinstance(c, BarContainer)):
            horizontal = getattr(c, "orientation", "vertical") == "horizontal"
            axis = ax.yaxis if horizontal else ax.xaxis
            labels = {round(t, 6): l.get_text() for t, l in zip(axis.get_ticklocs(), axis.get_ticklabels())}
            group = c.get_label()
            m = re.fullmatch(r"_container(\d+)", group or "")
            group = "Group %s" % m.group(1) if m else (group or "Group %d" % i)
            for r in c.patches:
                at = r.get_y() + r.get_height() / 2 if horizontal else r.get_x() + r.get_width() / 2
                label = labels.get(round(at, 6)) or str(plain(at))
                out["elements"].append({"label": label, "group": group,
                                        "value": plain(r.get_width() if horizontal else r.get_height())})
        if horizontal:
            swap(out)
        return out

    def box_chart(ax):
        # Boxes (patch_artist=True) span the quartiles; in the same band of
        # the category axis are the median (a line across the box), the
        # whiskers (lines from the box out to min and max) and the fliers
        # (a line of markers only).
        out = planar(ax, "box_and_whisker")
        boxes = []
        for p in ax.patches:
            v = p.get_path().vertices
            boxes.append((min(v[:, 0]), max(v[:, 0]), min(v[:, 1]), max(v[:, 1])))
        if not boxes:
            return out
        widths = {rounded(b[1] - b[0]) for b in boxes}
        heights = {rounded(b[3] - b[2]) for b in boxes}
        vertical = len(widths) == 1 or len(heights) != 1
        axis = ax.xaxis if vertical else ax.yaxis
        ticks = {round(t, 6): l.get_text() for t, l in zip(axis.get_ticklocs(), axis.get_ticklabels())}
        for x0, x1, y0, y1 in boxes:
            lo, hi, q1, q3 = (x0, x1, y0, y1) if vertical else (y0, y1, x0, x1)
            e = {"label": ticks.get(round((lo + hi) / 2, 6), str(plain((lo + hi) / 2))),
                 "min": rounded(q1), "first_quartile": rounded(q1), "median": rounded(q1),
                 "third_quartile": rounded(q3), "max": rounded(q3), "outliers": []}
            for l in ax.get_lines():
                band, vals = (l.get_xdata(), l.get_ydata()) if vertical else (l.get_ydata(), l.get_xdata())
                band = [float(b) for b in band]
                vals = [rounded(v) for v in vals]
                if not band or not all(lo - 1e-9 <= b <= hi + 1e-9 for b in band):
                    continue
                if l.get_linestyle() in ("None", "none", "", " "):
                    e["outliers"].extend(vals)
                elif len(vals) == 2 and vals[0] == vals[1] and rounded(q1) <= vals[0] <= rounded(q3):
                    if len(set(band)) == 2 and min(band) <= lo + 1e-9 and max(band) >= hi - 1e-9:
                        e["median"] = vals[0]
                elif len(vals) == 2 and len(set(band)) == 1:
                    if max(vals) <= rounded(q1):
                        e["min"] = min(vals)
                    elif min(vals) >= rounded(q3):
                        e["max"] = max(vals)
            out["elements"].append(e)
        if not vertical:
            swap(out)
        return out

    def one(ax):
        # Limits (and so ticks) are computed lazily: bring them up to date
        # with the data, as drawing would.
        ax.get_xlim(), ax.get_ylim()
        artists = ax.lines + ax.patches + ax.collections + ax.images + ax.tables + ax.artists
        if all(isinstance(a, Line2D) for a in artists):
            return line_chart(ax)
        if all(isinstance(a, (PathPatch, Line2D)) for a in artists):
            return box_chart(ax)
        artists = [a for a in artists if not (isinstance(a, Line2D) and straight(a))]
        if all(isinstance(a, PathCollection) for a in artists):
            return scatter_chart(ax)
        if all(isinstance(a, Wedge) for a in artists):
            return pie_chart(ax)
        if all(isinstance(a, Rectangle) for a in artists):
            return bar_chart(ax)
        return base(ax, "unknown")

    axes = fig.get_axes()
    if not any(ax.has_data() for ax in axes):
        return None
    if len(axes) == 1:
        return one(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    return {"type": "superchart", "title": none_if_empty(title), "elements": [one(ax) for ax in axes]}
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
// A cell is a script, where import declarations are a syntax error: each
// becomes assignments of a dynamic import's bindings to globals (sloppy
// mode), so the names outlive the cell like a kernel's would. The cell then
// has an await, and runs as an async function's body.
globalThis.__lzImport = (m) => import(m)
globalThis.__lzDefault = (ns) => ('default' in ns ? ns.default : ns)
const importDecl = /^[ \t]*import[ \t]+(?:([\w$]+)[ \t]*,?[ \t]*)?(\*[ \t]*as[ \t]+[\w$]+|\{[^}]*\})?[ \t]*(?:from[ \t]*)?(['"][^'"\n]+['"])[ \t]*;?/gm
const rewriteImports = (code) => code.replace(importDecl, (all, def, rest, spec) => {
  if (!def && !rest && /\bfrom\b/.test(all)) return all
  const ns = '(await __lzImport(' + spec + '))'
  const out = []
  if (def) out.push(def + ' = __lzDefault' + ns)
  if (rest && rest[0] === '*') out.push(rest.replace(/^\*\s*as\s+/, '') + ' = ' + ns)
  else if (rest) out.push('({' + rest.slice(1, -1).replace(/\bas\b/g, ':') + '} = ' + ns + ')')
  if (!out.length) out.push(ns)
  return out.join('; ') + ';'
})
// A TypeScript cell is transpiled to JavaScript first (types dropped, no
// type checking), by Debian's node-typescript, loaded at the first one.
let ts
const transpile = (code) => {
  if (!ts) { try { ts = require('typescript') } catch { ts = require('/usr/share/nodejs/typescript') } }
  const out = ts.transpileModule(code, { compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext } })
  return out.outputText.replace(/^export \{\};?[ \t]*$/m, '')
}
let base = {}
const run = async (req) => {
  try {
    if (req.ts) req.code = transpile(req.code)
  } catch (e) {
    return { error: { name: 'TranspileError', value: String(e && e.message || e), traceback: String(e && e.stack || e) } }
  }
  req.code = rewriteImports(req.code)
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
    return { result: value === undefined ? null : { 'text/plain': typeof value === 'string' ? util.inspect(value) : util.inspect(value, { depth: 4 }) } }
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


# The Java runner (ProcessContext): JShell evaluating cells in its own JVM.
JAVA_RUNNER = r"""
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.HashMap;
import java.util.Map;
import java.util.stream.Collectors;

import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;

// The Java runner of a code-interpreter context: one JShell, evaluating in
// this JVM (the local execution engine), so each cell sees what the last
// one declared. A request is a line of base64 tokens: nonce, code, the
// number of the sandbox's variables and their names and values, then the
// same for the call's own. Both are system properties while the cell runs;
// the call's are put back afterwards.
public class LizardRunner {
    static final Base64.Decoder B64 = Base64.getDecoder();
    static Map<String, String> base = new HashMap<>();

    public static void main(String[] args) throws Exception {
        JShell js = JShell.builder().executionEngine("local").build();
        SourceCodeAnalysis sca = js.sourceCodeAnalysis();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] t = line.split(" ", -1);
            int i = 0;
            String nonce = t[i++];
            String code = text(t[i++]);
            Map<String, String> b = new HashMap<>();
            for (int n = Integer.parseInt(t[i++]); n > 0; n--, i += 2) b.put(text(t[i]), text(t[i + 1]));
            Map<String, String> call = new HashMap<>();
            for (int n = Integer.parseInt(t[i++]); n > 0; n--, i += 2) call.put(text(t[i]), text(t[i + 1]));
            for (String k : base.keySet()) if (!b.containsKey(k)) System.clearProperty(k);
            b.forEach(System::setProperty);
            base = b;
            Map<String, String> saved = new HashMap<>();
            call.forEach((k, v) -> saved.put(k, System.setProperty(k, v)));
            String outcome;
            try {
                outcome = run(js, sca, code);
            } catch (Throwable x) {
                // JShell's own failure is the cell's error, not the runner's end.
                outcome = error(x);
            } finally {
                saved.forEach((k, v) -> {
                    if (v == null) System.clearProperty(k);
                    else System.setProperty(k, v);
                });
            }
            System.out.flush();
            System.err.flush();
            System.err.print("\0LZ:" + nonce + "\n");
            System.err.flush();
            System.out.print("\0LZ:" + nonce + ":" + outcome + "\n");
            System.out.flush();
        }
    }

    static String text(String b64) {
        return new String(B64.decode(b64), StandardCharsets.UTF_8);
    }

    // run evaluates the cell's snippets in order; the value of the last, if
    // it is an expression, is the result. The first that fails ends the cell.
    static String run(JShell js, SourceCodeAnalysis sca, String code) {
        String rest = code;
        String value = null;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
            String src;
            if (ci.completeness().isComplete()) {
                src = ci.source();
                rest = ci.remaining();
            } else {
                src = rest;
                rest = "";
            }
            value = null;
            for (SnippetEvent e : js.eval(src)) {
                if (e.causeSnippet() != null) continue;
                if (e.exception() != null) return error(e.exception());
                if (e.status() == Snippet.Status.REJECTED) {
                    String msg = js.diagnostics(e.snippet()).map(d -> d.getMessage(null)).collect(Collectors.joining("\n"));
                    return "{\"error\": {\"name\": \"CompilationError\", \"value\": " + quote(msg) + ", \"traceback\": " + quote(msg + "\n" + e.snippet().source()) + "}}";
                }
                Snippet.SubKind sk = e.snippet().subKind();
                if (sk == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND || sk == Snippet.SubKind.VAR_VALUE_SUBKIND
                        || sk == Snippet.SubKind.ASSIGNMENT_SUBKIND || sk == Snippet.SubKind.OTHER_EXPRESSION_SUBKIND) {
                    value = e.value();
                }
            }
        }
        if (value == null) return "{}";
        return "{\"result\": {\"text/plain\": " + quote(value) + "}}";
    }

    static String error(Throwable x) {
        String name = x.getClass().getSimpleName();
        if (x instanceof EvalException) name = ((EvalException) x).getExceptionClassName();
        String msg = x.getMessage() == null ? "" : x.getMessage();
        if (x instanceof UnresolvedReferenceException) msg = "unresolved reference: " + ((UnresolvedReferenceException) x).getSnippet().source();
        StringBuilder tb = new StringBuilder(name + ": " + msg);
        for (StackTraceElement s : x.getStackTrace()) tb.append("\n\tat ").append(s);
        return "{\"error\": {\"name\": " + quote(name) + ", \"value\": " + quote(msg) + ", \"traceback\": " + quote(tb.toString()) + "}}";
    }

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
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
    return langs | {lang for lang, need in RUNNERS.items()
                    if (os.path.exists(need) if os.path.isabs(need) else shutil.which(need))}


def to_result(content, main):
    return result_event(content.get("data", {}), main)


def result_event(data, main):
    """The NDJSON event of a display bundle. The text of a string's repr
    loses its quotes, as E2B's server gives it ('a' is a)."""
    out = {"type": "result", "is_main_result": main}
    for mime, value in data.items():
        if mime == "text/plain" and isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
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

    async def chdir(self, cwd):
        async with self.lock:
            if not await self.run_silent("__import__('os').chdir(%r)" % cwd):
                raise RuntimeError("changing the kernel's directory failed")
            self.cwd = cwd

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
            dialect = DIALECTS[self.language]
            if base_env != self.base_env:
                if not await self.run_silent(dialect.set_base_env(self.base_env, base_env)):
                    raise RuntimeError("setting the sandbox's environment failed")
                self.base_env = base_env
            if env:
                await self.run_silent(dialect.set_env(env))
            try:
                msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
                async for msg in self.messages(msg_id, gone):
                    out = message_event(msg)
                    if out is not None and not gone():
                        await emit(out)
            finally:
                if env:
                    await self.run_silent(dialect.restore_env())


class PythonDialect:
    """The code that sets a Python kernel's environment (the _lizard_ci
    helpers PYTHON_SETUP defines)."""

    @staticmethod
    def set_base_env(old, env):
        return "__import__('_lizard_ci').set_base_env(%r)" % (env,)

    @staticmethod
    def set_env(env):
        return "__import__('_lizard_ci').set_env(%r)" % (env,)

    @staticmethod
    def restore_env():
        return "__import__('_lizard_ci').restore_env()"


def r_string(s):
    """s as an R string literal: R reads JSON's escapes (all but \\/, which
    json.dumps does not write)."""
    return json.dumps(s, ensure_ascii=False)


class RDialect:
    """The same for an R kernel: Sys.setenv and Sys.unsetenv, with a call's
    previous values kept in the option lizard.saved."""

    @staticmethod
    def setenv(env):
        return "Sys.setenv(%s)" % ", ".join("%s = %s" % (r_string(k), r_string(v)) for k, v in env.items())

    @classmethod
    def set_base_env(cls, old, env):
        gone = [k for k in old if k not in env]
        code = ["invisible(NULL)"]
        if gone:
            code.append("Sys.unsetenv(c(%s))" % ", ".join(map(r_string, gone)))
        if env:
            code.append(cls.setenv(env))
        return "; ".join(code)

    @classmethod
    def set_env(cls, env):
        keys = ", ".join(map(r_string, env))
        return "options(lizard.saved = Sys.getenv(c(%s), unset = NA, names = TRUE)); %s" % (keys, cls.setenv(env))

    @staticmethod
    def restore_env():
        return ("local({s <- getOption('lizard.saved'); for (k in names(s)) "
                "if (is.na(s[[k]])) Sys.unsetenv(k) else do.call(Sys.setenv, setNames(list(s[[k]]), k)); "
                "options(lizard.saved = NULL)})")


DIALECTS = {"python": PythonDialect, "r": RDialect}


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
    """A JavaScript, TypeScript, Java or bash context of our own: one node,
    JVM or bash process, kept for the context's life, that runs each execution in the same
    global state. An execution's output is what the process writes to its
    stdout and stderr until its end marker (MarkedStream)."""

    def __init__(self, language, cwd, sockdir):
        super().__init__(language, cwd, sockdir)
        self.proc = None
        self.out = self.err = None
        self.count = 0

    async def start(self):
        self.base_env = {}
        if self.language in ("javascript", "typescript"):
            argv = ["node", "-e", JS_RUNNER]
        elif self.language == "java":
            # The source-file launcher compiles the runner as it starts.
            src = os.path.join(self.sockdir, "LizardRunner.java")
            if not os.path.exists(src):
                tmp = src + ".%s.tmp" % uuid.uuid4().hex
                with open(tmp, "w") as f:
                    f.write(JAVA_RUNNER)
                os.replace(tmp, src)
            argv = ["java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", src]
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
        if self.language in ("javascript", "typescript"):
            # The sandbox's environment stays; a call's goes after it.
            return (json.dumps({"code": code, "env": env, "base": base_env, "nonce": nonce,
                                "ts": self.language == "typescript"}) + "\n").encode()
        if self.language == "java":
            def b64(t):
                return base64.b64encode(t.encode()).decode()
            tokens = [nonce, b64(code), str(len(base_env))]
            for k, v in base_env.items():
                tokens += [b64(k), b64(v)]
            tokens.append(str(len(env)))
            for k, v in env.items():
                tokens += [b64(k), b64(v)]
            return (" ".join(tokens) + "\n").encode()
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
        # A cell that exits the shell (exit 42) still ends with its marker:
        # the EXIT trap writes it, saying the runner ended.
        lines += [
            "__lz_end() { printf '\\0LZ:%s\\n' \"$1\" >&2; printf '\\0LZ:%s:{\"exit\": %d, \"ended\": %s}\\n' \"$1\" \"$2\" \"$3\"; }",
            "__lz_code=$(cat <<'%s'" % delim, code, delim, ")",
            "trap '__lz_end %s $? true' EXIT" % nonce,
            "{ %s eval \"$__lz_code\"; } </dev/null" % prefix,
            "__lz_rc=$?",
            "trap - EXIT",
            "__lz_end %s $__lz_rc false" % nonce,
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
            if o.get("ended"):
                # The next execution starts a fresh runner.
                await self.stop()
            if gone():
                return
            if o.get("result"):
                await emit(result_event(o["result"], True))
            if o.get("error"):
                await emit({"type": "error", **o["error"]})
            if o.get("exit"):
                await emit({"type": "error", "name": "ExitError", "value": "exit status %d" % o["exit"],
                            "traceback": "", "exit_code": o["exit"]})

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
        self.spare = None

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
        ctx = await self.take_spare() if language == "python" else None
        if ctx is not None:
            if cwd != ctx.cwd:
                await ctx.chdir(cwd)
        else:
            kind = JupyterContext if language in KERNELS else ProcessContext
            ctx = kind(language, cwd, self.sockdir)
            await ctx.start()
        self.contexts[ctx.id] = ctx
        return ctx

    async def restart(self, ctx_id):
        """Restarts a context. It answers once the context is held: the new
        kernel or runner comes up after (a Python one is the spare kernel,
        when ready), and the context's next execution waits for it, since
        clients give a restart only a few seconds."""
        ctx = self.get(ctx_id)
        await ctx.lock.acquire()

        async def swap():
            try:
                spare = await self.take_spare() if isinstance(ctx, JupyterContext) else None
                if spare is not None and spare.cwd != ctx.cwd:
                    await spare.chdir(ctx.cwd)
                await ctx.stop()
                if spare is None:
                    await ctx.start()
                else:
                    ctx.km, ctx.kc, ctx.base_env = spare.km, spare.kc, {}
            except Exception:
                log.exception("restart of context %s", ctx.id)
            finally:
                ctx.lock.release()
        asyncio.ensure_future(swap())

    def keep_spare(self):
        """Starts a Python kernel for the next context, unless one is
        there or starting: a kernel takes seconds to start and load its
        libraries, which the next create then does not wait for (clients
        give a create a few seconds). The ready state has it started."""
        if "python" in self.languages and self.spare is None:
            async def start():
                ctx = JupyterContext("python", self.default_cwd, self.sockdir)
                await ctx.start()
                return ctx
            self.spare = asyncio.ensure_future(start())

    async def take_spare(self):
        """The spare Python context (None when there is none or its start
        failed), and a new spare starting."""
        fut, self.spare = self.spare, None
        self.keep_spare()
        if fut is None:
            return None
        try:
            return await fut
        except Exception as e:
            log.warning("spare kernel: %s", e)
            return None

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
        if self.spare is not None:
            self.spare.cancel()
            if self.spare.done() and not self.spare.cancelled() and self.spare.exception() is None:
                await self.spare.result().stop()
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

    def check_token(self):
        """Once a token file exists (a secure E2B sandbox), executions need
        its token as X-Access-Token."""
        want = self.interp.token()
        if want and not hmac.compare_digest(self.request.headers.get("X-Access-Token", "").encode(), want.encode()):
            raise HTTPError(401, "invalid or missing X-Access-Token")

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
        self.check_token()
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
            for line in self.lines(ev):
                self.write(json.dumps(line) + "\n")
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

    def lines(self, ev):
        """The NDJSON lines of one event: E2B's are the events themselves."""
        return [ev]


class LizardExecute(Execute):
    """/execute of the Lizard SDK's protocol: stdout and stderr carry data;
    a result is one item per MIME type of its bundle ({mime, data}); an
    error is {name, message, traceback (without colors)}; done carries the execution count."""

    def lines(self, ev):
        t = ev["type"]
        if t in ("stdout", "stderr"):
            return [{"type": t, "data": ev["text"]}]
        if t == "number_of_executions":
            self.count = ev.get("execution_count") or 0
            return []
        if t == "result":
            return [{"type": "result", "mime": FIELD_MIMES.get(k, k), "data": v}
                    for k, v in ev.items() if k not in ("type", "is_main_result") and v is not None]
        if t == "error":
            # Plain text: IPython's colors are for a terminal.
            return [{"type": "error", "name": ev.get("name", ""), "message": ev.get("value", ""),
                     "traceback": ANSI_COLOR.sub("", ev.get("traceback", ""))}]
        if t == "unexpected_end_of_execution":
            return [{"type": "error", "name": "UnexpectedEndOfExecution", "message": ev.get("message", ""),
                     "traceback": ""}, {"type": "done", "execution_count": getattr(self, "count", 0)}]
        if t == "end_of_execution":
            return [{"type": "done", "execution_count": getattr(self, "count", 0)}]
        return []


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
            await self.interp.restart(ctx_id)
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


class TokenRequired:
    """A handler that needs the token once there is one, for all methods."""

    def prepare(self):
        try:
            self.check_token()
        except HTTPError as e:
            self.fail(e.status, e.message)


class LizardContexts(TokenRequired, Contexts):
    pass


class LizardContextOne(TokenRequired, ContextOne):
    pass


class LizardContextRestart(TokenRequired, ContextRestart):
    pass


def lizard_app(interp):
    """The Lizard SDK's protocol, on the same contexts as app's. Its
    /contexts too need the token once there is one: its client sends none,
    and a secure E2B sandbox's ports are public to whoever knows its id."""
    a = {"interp": interp}
    return tornado.web.Application([
        (r"/health", Health, a),
        (r"/execute", LizardExecute, a),
        (r"/contexts", LizardContexts, a),
        (r"/contexts/([^/]+)", LizardContextOne, a),
        (r"/contexts/([^/]+)/restart", LizardContextRestart, a),
    ])


async def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", default="0.0.0.0")
    p.add_argument("--port", type=int, default=49999)
    p.add_argument("--lizard-port", type=int, default=0,
                   help="also serve the Lizard SDK's protocol (CodeSandbox) here; 0: not")
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
    servers = [server]
    if args.lizard_port:
        lz = tornado.httpserver.HTTPServer(lizard_app(interp), idle_connection_timeout=3600)
        lz.listen(args.lizard_port, address=args.listen)
        servers.append(lz)
        log.info("Lizard SDK protocol on %s:%d", args.listen, args.lizard_port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    try:
        # The EAGER languages have their default context from the start,
        # started at once; Python's kernel first, as it takes longest.
        await asyncio.gather(*(interp.default(lang) for lang in EAGER if lang in interp.languages))
        interp.keep_spare()
        if interp.spare is not None:
            await asyncio.wait([interp.spare])
        interp.ready = True
        log.info("ready")
        await stop.wait()
    finally:
        for srv in servers:
            srv.stop()
        await interp.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
