"""Headless Chromium driven over the Chrome DevTools Protocol.

Standard library only: a minimal RFC 6455 websocket client (client frames
masked, text/continuation/ping/close handled) and a Chromium launcher that
reads the port from the DevToolsActivePort file Chromium writes when started
with --remote-debugging-port=0.
"""
import base64
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class WebSocket:
    def __init__(self, host, port, path, timeout=30):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        req = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
               "Upgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(req.encode())
        self.buf = b""
        head = self._until(b"\r\n\r\n").decode("latin-1")
        lines = head.split("\r\n")
        if " 101 " not in lines[0] + " ":
            raise OSError(f"websocket handshake refused: {lines[0]}")
        want = base64.b64encode(hashlib.sha1(
            (key + WS_GUID).encode()).digest()).decode()
        got = ""
        for l in lines[1:]:
            name, _, value = l.partition(":")
            if name.strip().lower() == "sec-websocket-accept":
                got = value.strip()
        if got != want:
            raise OSError("websocket handshake: bad Sec-WebSocket-Accept")

    def _fill(self):
        data = self.sock.recv(1 << 16)
        if not data:
            raise OSError("websocket closed by peer")
        self.buf += data

    def _until(self, sep):
        while sep not in self.buf:
            self._fill()
        i = self.buf.index(sep) + len(sep)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send_frame(self, opcode, payload):
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        body = bytes(b ^ mask[i & 3] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + body)

    def send(self, text):
        self._send_frame(0x1, text.encode())

    def recv(self):
        """One whole text message (continuation frames joined)."""
        parts = []
        while True:
            b0, b1 = self._take(2)
            fin, opcode = b0 & 0x80, b0 & 0x0F
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._take(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._take(8))[0]
            mask = self._take(4) if b1 & 0x80 else None
            data = self._take(n)
            if mask:
                data = bytes(b ^ mask[i & 3] for i, b in enumerate(data))
            if opcode == 0x9:
                self._send_frame(0xA, data)
                continue
            if opcode == 0xA:
                continue
            if opcode == 0x8:
                raise OSError("websocket closed by peer")
            parts.append(data)
            if fin:
                return b"".join(parts).decode()

    def close(self):
        try:
            self._send_frame(0x8, b"")
        except OSError:
            pass
        self.sock.close()


class CDP:
    """Commands to one page target; events are kept for wait_event."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method,
                     "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expr):
        """Value of a JavaScript expression (awaited if a promise)."""
        r = self.call("Runtime.evaluate", expression=expr,
                  returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"JS exception in {expr!r}: "
                       f"{r['exceptionDetails']}")
        return r["result"].get("value")


def find_chromium():
    for name in (os.environ.get("CHROMIUM", ""), "chromium",
             "chromium-browser", "google-chrome", "chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class Browser:
    def __init__(self, binary, profile_dir, width=1000, height=760):
        self.profile = profile_dir
        self.log = open(os.path.join(profile_dir, "chromium.log"), "w")
        args = [binary, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-dev-shm-usage", "--no-first-run",
            "--no-default-browser-check", "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update", "--hide-scrollbars",
            f"--window-size={width},{height}",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile_dir}", "about:blank"]
        # Its own session, so close() can stop the renderer and helper
        # processes too: one left running keeps writing into the profile
        # while the caller removes it.
        self.proc = subprocess.Popen(args, stdout=self.log,
                         stderr=subprocess.STDOUT, start_new_session=True)
        self.port = self._read_port()

    def _read_port(self, timeout=30):
        path = os.path.join(self.profile, "DevToolsActivePort")
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("chromium exited with "
                           f"{self.proc.returncode}; "
                           f"see {self.log.name}")
            try:
                with open(path) as f:
                    first = f.readline().strip()
                if first:
                    return int(first)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError("chromium wrote no DevToolsActivePort")

    def page(self):
        """A CDP session on the first page target."""
        end = time.time() + 15
        while True:
            c = http.client.HTTPConnection("127.0.0.1", self.port,
                               timeout=10)
            c.request("GET", "/json/list")
            targets = json.loads(c.getresponse().read())
            c.close()
            pages = [t for t in targets if t.get("type") == "page"]
            if pages or time.time() > end:
                break
            time.sleep(0.1)
        if not pages:
            raise RuntimeError("chromium has no page target")
        url = pages[0]["webSocketDebuggerUrl"]
        path = url.split(str(self.port), 1)[1]
        return CDP(WebSocket("127.0.0.1", self.port, path))

    def close(self):
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def _signal_group(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def remove_profile(self, tries=20):
        """Remove the profile directory; helper processes that were
        killed may still be flushing for a moment, so retry."""
        for _ in range(tries - 1):
            try:
                shutil.rmtree(self.profile)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.25)
        shutil.rmtree(self.profile, ignore_errors=True)
