"""TEST DOUBLE: a scripted stand-in for `loom serve`, used only to check the
chat page's client logic (SSE split at awkward byte boundaries, error bodies,
escaping, what the page sends). It is never a replacement for the real server:
test_chat_page.py drives the real `loom serve` for the end-to-end check.

Behaviour, chosen by the last user message:
  "error"   -> HTTP 400 with an OpenAI-shaped error body
  "midway"  -> a few deltas, then an error event inside the stream
  "slow"    -> one delta every 50 ms for 10 s (for the stop button)
  "markdown"-> MARKDOWN: Markdown with code, a table and links, and hostile
               HTML (<script>, <img onerror>, javascript: links) the page
               must not run
  anything  -> REPLY, sent as SSE with \r\n line ends, a comment line, and
               the bytes cut into 1..7-byte writes (so lines and UTF-8
               sequences are split across network chunks)
Every request body is kept in `requests` for the test to inspect.
"""
import http.server
import json
import os
import sys
import threading
import time

REPLY = ["Héllo", " <b>bold</b>", " <img src=x onerror=\"window.pwned=1\">",
         " ✓ 🙂", " line\nbreak", " &amp; done."]
ERROR_MSG = "max_tokens must be a positive integer (test double)"
MARKDOWN = ["# Title\n\nSome **strong** and *em* text with `code`.\n\n",
            "```python\ndef f(x):\n    return x + 1  # one more\n```\n\n",
            "| a | b |\n|---|---|\n| 1 | 2 |\n\n",
            "- [safe](https://example.com/x) and [bad](javascript:window.pwned=2)\n",
            "- <script>window.pwned=3</script>\n",
            "- <img src=x onerror=\"window.pwned=4\"> ![pic](x \"t\")\n\n",
            "<div onclick=\"window.pwned=5\"><iframe src=\"javascript:window.pwned=6\"></iframe></div>\n",
            "[ref][r]\n\n[r]: javascript:window.pwned=7\n"]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small writes leave as small packets

    def log_message(self, *args):
        pass

    def _send(self, code, ctype, body):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.server.auth.append(self.headers.get("Authorization"))
        if self.path == "/":
            self._send(200, "text/html; charset=utf-8", self.server.page)
        elif self.path == "/v1/models":
            body = {"object": "list", "data": [{"id": "fake-model",
                                                "object": "model"}]}
            self._send(200, "application/json", json.dumps(body).encode())
        else:
            self._send(404, "text/plain", b"not found")

    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj):
        return ("data: " + json.dumps(obj, ensure_ascii=False) +
                "\r\n\r\n").encode()

    def _delta(self, text):
        return self._event({"object": "chat.completion.chunk",
                            "choices": [{"index": 0,
                                         "delta": {"content": text},
                                         "finish_reason": None}]})

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(n))
        self.server.requests.append(req)
        self.server.auth.append(self.headers.get("Authorization"))
        last = req["messages"][-1]["content"]
        if last == "error":
            body = {"error": {"message": ERROR_MSG,
                              "type": "invalid_request_error"}}
            self._send(400, "application/json", json.dumps(body).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._stream(last)
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.server.aborted += 1
            self.server.aborted_prompts.append(last)

    def _stream(self, last):
        if last == "slow":
            for i in range(200):
                self._chunk(self._delta(f"{i} "))
                time.sleep(0.05)
            return
        if last == "midway":
            self._chunk(self._delta("partial"))
            self._chunk(self._event({"error": {"message": "engine failed "
                                               "(test double)"}}))
            return
        pieces = MARKDOWN if last == "markdown" else REPLY
        data = b": keep-alive comment\r\n\r\n"
        data += self._event({"choices": [{"index": 0,
                                          "delta": {"role": "assistant"}}]})
        for piece in pieces:
            data += self._delta(piece)
        data += self._event({"choices": [{"index": 0, "delta": {},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 5,
                                       "completion_tokens": len(pieces),
                                       "total_tokens": 5 + len(pieces)}})
        data += b"data: [DONE]\r\n\r\n"
        i, step = 0, 1
        while i < len(data):
            self._chunk(data[i:i + step])
            time.sleep(0.002)
            i += step
            step = step % 7 + 1


def start(page_path):
    """Serve on a free port in a thread; returns the server object."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    with open(page_path, "rb") as f:
        srv.page = f.read()
    srv.requests = []
    srv.auth = []  # the Authorization header of each request (None: absent)
    srv.aborted = 0
    srv.aborted_prompts = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    page = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        here, "..", "..", "build", "server", "index.html")
    s = start(page)
    print(f"test double on http://127.0.0.1:{s.server_address[1]}/")
    threading.Event().wait()
