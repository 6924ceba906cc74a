# A small web app the preview tests run inside a sandbox: it echoes what it
# received, streams Server-Sent Events and large bodies, and echoes WebSocket
# text frames. Standard library only (the base template has python3).
import base64, hashlib, json, socketserver, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_body(self, body, ctype="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        if self.path.startswith("/sse"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for i in range(3):
                self.wfile.write(f"data: tick {i}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.5)
            self.close_connection = True
            return
        if self.path.startswith("/big") or self.path.startswith("/mib"):
            n = 8 << 20 if self.path.startswith("/big") else 1 << 20
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = b"x" * 65536
            for _ in range(n // len(chunk)):
                self.wfile.write(chunk)
            return
        if self.path.startswith("/browser"):
            html = b"""<!doctype html><title>lizard browser test</title>
<h1 id=msg>hello from the sandbox</h1><p id=ws>waiting</p>
<script>
const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws')
ws.onopen = () => ws.send('from the browser')
ws.onmessage = (e) => { document.getElementById('ws').textContent = e.data }
ws.onerror = () => { document.getElementById('ws').textContent = 'websocket error' }
</script>"""
            return self.send_body(html, "text/html")
        if self.path.startswith("/page"):
            html = b"<!doctype html><title>lizard preview</title><h1 id=msg>hello from the sandbox</h1>"
            return self.send_body(html, "text/html")
        info = {"path": self.path, "headers": {k: v for k, v in self.headers.items()}}
        self.send_body(json.dumps(info).encode())

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        data = self.rfile.read(n)
        self.send_body(json.dumps({"received": len(data), "sha256": hashlib.sha256(data).hexdigest()}).encode())

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"].encode()
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = int.from_bytes(self.rfile.read(2), "big")
            elif n == 127:
                n = int.from_bytes(self.rfile.read(8), "big")
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if opcode == 8:
                return
            reply = b"echo: " + payload
            frame = bytes([0x81])
            if len(reply) < 126:
                frame += bytes([len(reply)])
            else:
                frame += bytes([126]) + len(reply).to_bytes(2, "big")
            self.wfile.write(frame + reply)
            self.wfile.flush()


ThreadingHTTPServer.allow_reuse_address = True
# The address to bind is the second argument (default: every address).
bind = sys.argv[2] if len(sys.argv) > 2 else "0.0.0.0"
ThreadingHTTPServer((bind, int(sys.argv[1])), App).serve_forever()
