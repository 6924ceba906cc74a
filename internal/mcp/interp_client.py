# lizard's MCP server: one request to the sandbox's code-interpreter server
# (internal/codeinterp, on 127.0.0.1), run through the API's exec. Its
# answer goes to stdout one event a line: "=" and a JSON line of the answer
# (an NDJSON event of /execute, or the JSON of another route); a line longer
# than CHUNK goes as "+" parts before its "=" end. "!" and a JSON
# {status, message} is a refusal: the server's (status) or no server (0).
import json
import os
import sys
import urllib.error
import urllib.request

CHUNK = 65536


def out(mark, s):
    while len(s) > CHUNK:
        sys.stdout.write("+" + s[:CHUNK] + "\n")
        s = s[CHUNK:]
    sys.stdout.write(mark + s + "\n")
    sys.stdout.flush()


def main():
    port, token_file, arg = sys.argv[1], sys.argv[2], sys.argv[3]
    if arg.startswith("@"):
        with open(arg[1:]) as f:
            req = json.load(f)
        os.remove(arg[1:])
    else:
        req = json.loads(arg)
    headers = {"Content-Type": "application/json"}
    try:
        with open(token_file) as f:
            token = f.read().strip()
    except OSError:
        token = ""
    if token:
        headers["X-Access-Token"] = token
    body = json.dumps(req["body"]).encode() if "body" in req else None
    r = urllib.request.Request("http://127.0.0.1:%s%s" % (port, req["path"]), data=body,
                               headers=headers, method=req["method"])
    try:
        resp = urllib.request.urlopen(r)
    except urllib.error.HTTPError as e:
        text = e.read().decode("utf-8", "replace")
        try:
            msg = json.loads(text).get("message") or text
        except (ValueError, AttributeError):
            msg = text
        out("!", json.dumps({"status": e.code, "message": msg}))
        return 2
    except OSError as e:
        out("!", json.dumps({"status": 0, "message": str(getattr(e, "reason", e))}))
        return 3
    with resp:
        while True:
            line = resp.readline()
            if not line:
                return 0
            line = line.decode("utf-8", "replace").rstrip("\r\n")
            if line:
                out("=", line)


sys.exit(main())
