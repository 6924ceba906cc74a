"""A model endpoint of the test's own, for coding agents in sandboxes.

It speaks enough of Anthropic's Messages API (POST /v1/messages, streamed
or not, and count_tokens) and of OpenAI's Responses and Chat Completions
APIs (POST /v1/responses, /v1/chat/completions, streamed) for Claude Code
and Codex to run one turn: every request is appended as one JSON line
(method, path, body) to the log file, and every answer is the text given.

usage: fakemodel.py PORT LOGFILE ANSWER
"""

import json
import sys
import time
import http.server as h

PORT, LOG, ANSWER = int(sys.argv[1]), sys.argv[2], sys.argv[3]


def sse(w, event, data):
    w.write(("event: %s\ndata: %s\n\n" % (event, json.dumps(data))).encode())
    w.flush()


class H(h.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def record(self, body):
        with open(LOG, "a") as f:
            f.write(json.dumps({"method": self.command, "path": self.path, "body": body}) + "\n")

    def read(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {"raw": raw.decode("utf-8", "replace")}

    def reply(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def do_GET(self):
        self.record(None)
        if self.path.startswith("/v1/models"):
            return self.reply(200, {"data": [{"id": "fake-model", "object": "model", "type": "model", "display_name": "fake"}],
                                    "models": [], "has_more": False})
        self.reply(200, {})

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        body = self.read()
        self.record(body)
        path = self.path.split("?")[0]
        model = body.get("model", "fake-model") if isinstance(body, dict) else "fake-model"
        if path.endswith("/count_tokens"):
            return self.reply(200, {"input_tokens": 12})
        if path.endswith("/v1/messages"):
            return self.messages(body, model)
        if path.endswith("/responses"):
            return self.openai_responses(model)
        if path.endswith("/chat/completions"):
            return self.chat(body, model)
        self.reply(404, {"error": {"type": "not_found", "message": "no " + path}})

    def messages(self, body, model):
        usage = {"input_tokens": 12, "output_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        msg = {"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "stop_reason": None,
               "stop_sequence": None, "usage": usage, "content": []}
        if not body.get("stream"):
            msg["content"] = [{"type": "text", "text": ANSWER}]
            msg["stop_reason"] = "end_turn"
            return self.reply(200, msg)
        self.stream()
        sse(self.wfile, "message_start", {"type": "message_start", "message": msg})
        sse(self.wfile, "content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        sse(self.wfile, "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ANSWER}})
        sse(self.wfile, "content_block_stop", {"type": "content_block_stop", "index": 0})
        sse(self.wfile, "message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                          "usage": {"output_tokens": 3}})
        sse(self.wfile, "message_stop", {"type": "message_stop"})

    def openai_responses(self, model):
        now = int(time.time())
        item = {"id": "msg_fake", "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": ANSWER, "annotations": []}]}
        resp = {"id": "resp_fake", "object": "response", "created_at": now, "model": model, "status": "in_progress", "output": []}
        self.stream()
        sse(self.wfile, "response.created", {"type": "response.created", "sequence_number": 0, "response": resp})
        sse(self.wfile, "response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                                                       "item": dict(item, status="in_progress", content=[])})
        sse(self.wfile, "response.content_part.added", {"type": "response.content_part.added", "sequence_number": 2, "item_id": "msg_fake",
                                                        "output_index": 0, "content_index": 0,
                                                        "part": {"type": "output_text", "text": "", "annotations": []}})
        sse(self.wfile, "response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 3, "item_id": "msg_fake",
                                                       "output_index": 0, "content_index": 0, "delta": ANSWER})
        sse(self.wfile, "response.output_text.done", {"type": "response.output_text.done", "sequence_number": 4, "item_id": "msg_fake",
                                                      "output_index": 0, "content_index": 0, "text": ANSWER})
        sse(self.wfile, "response.content_part.done", {"type": "response.content_part.done", "sequence_number": 5, "item_id": "msg_fake",
                                                       "output_index": 0, "content_index": 0,
                                                       "part": {"type": "output_text", "text": ANSWER, "annotations": []}})
        sse(self.wfile, "response.output_item.done", {"type": "response.output_item.done", "sequence_number": 6, "output_index": 0, "item": item})
        done = dict(resp, status="completed", output=[item],
                    usage={"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3,
                           "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15})
        sse(self.wfile, "response.completed", {"type": "response.completed", "sequence_number": 7, "response": done})

    def chat(self, body, model):
        chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        if not body.get("stream"):
            return self.reply(200, {"id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": ANSWER}}],
                                    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})
        self.stream()
        for delta, finish in (({"role": "assistant", "content": ANSWER}, None), ({}, "stop")):
            c = dict(chunk, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])
            self.wfile.write(("data: %s\n\n" % json.dumps(c)).encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


h.ThreadingHTTPServer(("0.0.0.0", PORT), H).serve_forever()
