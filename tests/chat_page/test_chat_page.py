"""The chat page of `loom serve`, in a real browser.

argv[1] is the loom binary, argv[2] the page as built (server/web/index.html
with marked and highlight.js put in); the model comes from $LOOM_MODEL. Starts
`loom serve`, opens its page (GET /) in headless Chromium driven over the
DevTools protocol, types prompts, clicks Send and watches the reply stream
in: it must be non-empty and grow over several samples, not land at once.
Also stops a long reply with the Stop button and checks the server still
answers. A screenshot goes to $LOOM_BUILD_ROOT/tests/chat_page/.

Then the page's client logic is checked against fake_server.py, a scripted
test double (SSE cut at every byte boundary, error bodies, HTML in the model
output, what the page sends), and the Markdown rendering and its sanitizer
(a reply with <script>, <img onerror>, javascript: links), history and the
system prompt across a reload (localStorage), the API key field. Exits 77 when the model or Chromium is absent.
"""
import base64
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cdp  # noqa: E402
import fake_server  # noqa: E402

sys.path.insert(0, os.path.join(HERE, ".."))
from ports import free_port  # noqa: E402

PAGE_SRC = None  # the page as built (build/server/index.html): argv[2]
failures = []
passed = 0
API_KEY = "page-test-key"


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(f"{name}: {detail}")
        print(f"FAIL {name}: {detail}", flush=True)


def http_get(port, path, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read()
    finally:
        c.close()


# ---- page helpers (everything through CDP, like a user would) ----

def open_page(page, url):
    page.call("Page.enable")
    page.call("Runtime.enable")
    page.call("Page.navigate", url=url)
    end = time.time() + 30
    while time.time() < end:
        if page.eval("document.readyState === 'complete' && "
                     "!!document.getElementById('prompt')"):
            return True
        time.sleep(0.05)
    return False


def set_number(page, elem_id, value):
    page.eval(f"(() => {{ const e = document.getElementById('{elem_id}');"
              f" e.value = '{value}';"
              " e.dispatchEvent(new Event('input')); })()")


def set_text(page, elem_id, value):
    """Sets an input's value as typing would, firing input and change."""
    page.eval(f"(() => {{ const e = document.getElementById('{elem_id}');"
              f" e.value = {json.dumps(value)};"
              " e.dispatchEvent(new Event('input'));"
              " e.dispatchEvent(new Event('change')); })()")


def type_prompt(page, text):
    """Focus the message box, clear it, and type text as key input."""
    page.eval("(() => { const p = document.getElementById('prompt');"
              " p.focus(); p.select(); })()")
    page.call("Input.insertText", text=text)


def click(page, elem_id):
    r = page.eval(f"(() => {{ const b = document.getElementById('{elem_id}')"
                  ".getBoundingClientRect(); return [b.x + b.width / 2,"
                  " b.y + b.height / 2]; })()")
    for kind in ("mousePressed", "mouseReleased"):
        page.call("Input.dispatchMouseEvent", type=kind, x=r[0], y=r[1],
                  button="left", clickCount=1)


def press_enter(page):
    page.call("Input.dispatchKeyEvent", type="keyDown", key="Enter",
              code="Enter", windowsVirtualKeyCode=13, text="\r")
    page.call("Input.dispatchKeyEvent", type="keyUp", key="Enter",
              code="Enter", windowsVirtualKeyCode=13)


REPLY_JS = """(() => {
  const all = document.querySelectorAll('#log .msg.assistant');
  const m = all[all.length - 1];
  if (!m) return {count: 0};
  return {count: all.length, state: m.dataset.state,
          text: m.querySelector('.text').textContent,
          note: m.querySelector('.note').textContent,
          role: m.getAttribute('role'),
          send: document.getElementById('send').disabled,
          stop: document.getElementById('stop').disabled,
          status: document.getElementById('status').textContent,
          body: document.body.innerText};
})()"""


def wait_reply(page, count, timeout=120, until=None):
    """Poll the newest reply until it is no longer streaming (or until()
    holds). Returns (final snapshot, [(seconds, length)] samples)."""
    t0 = time.time()
    samples = []
    snap = {}
    while time.time() - t0 < timeout:
        snap = page.eval(REPLY_JS)
        if snap.get("count", 0) >= count:
            samples.append((time.time() - t0, len(snap["text"]),
                            snap["state"]))
            if until and until(snap):
                break
            if snap["state"] != "streaming":
                break
        time.sleep(0.01)
    return snap, samples


def growth(samples):
    """Distinct non-zero lengths seen while the reply was streaming."""
    return sorted({n for _, n, st in samples if st == "streaming" and n > 0})


# Polling from here sees a reply only as often as a round trip to the
# browser allows, and a loaded machine makes that rare enough to miss a
# fast reply's growth. The page records each length its streaming reply
# shows, as the DOM changes, so the check does not race the model.
WATCH_JS = """(() => {
  window.__lens = new Set();
  new MutationObserver(() => {
    const all = document.querySelectorAll('#log .msg.assistant');
    const m = all[all.length - 1];
    if (m && m.dataset.state === 'streaming')
      window.__lens.add(m.querySelector('.text').textContent.length);
  }).observe(document.getElementById('log'),
             {subtree: true, childList: true, characterData: true});
})()"""


def page_growth(page):
    """Distinct non-zero lengths the page showed since WATCH_JS ran."""
    lens = page.eval("Array.from(window.__lens || [])") or []
    return sorted(n for n in lens if n > 0)


def screenshot(page, name):
    root = os.environ.get("LOOM_BUILD_ROOT") or os.getcwd()
    outdir = os.path.join(root, "tests", "chat_page")
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, name)
    png = page.call("Page.captureScreenshot", format="png")["data"]
    with open(path, "wb") as f:
        f.write(base64.b64decode(png))
    print(f"screenshot: {path}", flush=True)
    return path


# ---- the real server ----

def start_serve(loom, model, port, logf):
    proc = subprocess.Popen([loom, "serve", "--model", model,
                             "--port", str(port), "--api-key", API_KEY],
                            stdout=logf, stderr=subprocess.STDOUT)
    end = time.time() + 120
    while time.time() < end:
        if proc.poll() is not None:
            return proc, f"loom serve exited with {proc.returncode}"
        try:
            # /health answers while the model loads; /ready once it can
            # take requests.
            if http_get(port, "/ready")[0] == 200:
                return proc, None
        except OSError:
            pass
        time.sleep(0.2)
    return proc, "loom serve was not ready (GET /ready) within 120 s"


def real_server(browser, loom, model, tmp):
    port = free_port()
    logpath = os.path.join(tmp, "serve.log")
    with open(logpath, "w") as logf:
        proc, err = start_serve(loom, model, port, logf)
    try:
        if err:
            with open(logpath) as f:
                check("loom serve starts", False, err + ": " + f.read()[-2000:])
            return
        before = len(failures)
        real_checks(browser, port)
        if len(failures) > before:
            with open(logpath, errors="replace") as f:
                print("loom serve log (tail):\n" + f.read()[-3000:])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            check("loom serve exits on SIGTERM", False, "killed after 20 s")


def real_checks(browser, port):
    status, ctype, body = http_get(port, "/")
    with open(PAGE_SRC, "rb") as f:
        src = f.read()
    check("GET / is the page", status == 200 and "text/html" in ctype
          and body == src, f"{status} {ctype} {len(body)} bytes, "
          f"source has {len(src)}")

    page = browser.page()
    check("page loads", open_page(page, f"http://127.0.0.1:{port}/"))
    # without the key the server refuses, and the page says where to set it
    type_prompt(page, "Hi")
    click(page, "send")
    snap, _ = wait_reply(page, 1, timeout=20)
    check("missing API key explained", snap.get("state") == "error"
          and "API key" in snap.get("note", ""), str(snap)[:300])
    page.eval("localStorage.clear(); sessionStorage.clear()")
    open_page(page, f"http://127.0.0.1:{port}/")
    set_text(page, "api-key", API_KEY)
    set_number(page, "temperature", "0")
    set_number(page, "max-tokens", "48")

    type_prompt(page, "Write a short poem about the sea.")
    page.eval(WATCH_JS)
    click(page, "send")
    snap, samples = wait_reply(page, 1)
    grew = sorted(set(growth(samples)) | set(page_growth(page)))
    print(f"reply 1: {len(snap.get('text', ''))} chars, {len(samples)} "
          f"samples, {len(grew)} distinct lengths while streaming "
          f"({len(page_growth(page))} recorded by the page)",
          flush=True)
    check("reply 1 done", snap.get("state") == "done", str(snap)[:500])
    check("reply 1 non-empty", snap.get("text", "").strip() != "", str(snap))
    check("reply 1 streamed (grew over >= 3 samples)", len(grew) >= 3,
          f"lengths seen {grew}")
    # textContent drops rendered Markdown's line breaks (<br>), innerText
    # lays them out: compare the characters other than whitespace
    words = "".join(snap.get("text", "").split())[:40]
    check("reply 1 in the document text",
          words in "".join(snap.get("body", "").split()),
          f"{words!r} not in {snap.get('body', '')[:400]!r}")
    check("status names tokens", "tokens" in snap.get("status", ""),
          snap.get("status"))
    check("buttons idle after reply", snap.get("send") is False
          and snap.get("stop") is True, str(snap)[:300])

    type_prompt(page, "Now say it in one line.")
    click(page, "send")
    snap, samples = wait_reply(page, 2)
    check("reply 2 (with history) done", snap.get("state") == "done"
          and snap.get("text", "").strip() != "", str(snap)[:500])
    screenshot(page, "chat_page.png")

    # Stop a long reply half way; the server must stay usable.
    set_number(page, "max-tokens", "2000")
    type_prompt(page, "Tell me a very long story about a dragon.")
    click(page, "send")
    snap, _ = wait_reply(page, 3, until=lambda s: len(s["text"]) > 20)
    if snap.get("state") != "streaming":
        print(f"note: reply ended ({snap.get('state')}) before Stop",
              flush=True)
    else:
        click(page, "stop")
        snap, _ = wait_reply(page, 3, timeout=10)
        n = len(snap.get("text", ""))
        time.sleep(0.5)
        later = page.eval(REPLY_JS)
        check("stop ends the reply", snap.get("state") == "stopped",
              str(snap)[:300])
        check("nothing arrives after stop", len(later["text"]) == n,
              f"{n} -> {len(later['text'])}")
    try:
        st = http_get(port, "/ready")[0]
    except OSError as e:
        st = str(e)
    check("server healthy after stop", st == 200, str(st))
    set_number(page, "max-tokens", "16")
    type_prompt(page, "Hello!")
    click(page, "send")
    snap, _ = wait_reply(page, 4)
    check("reply after stop done", snap.get("state") == "done"
          and snap.get("text", "") != "", str(snap)[:300])
    screenshot(page, "chat_page_after_stop.png")
    page.ws.close()


# ---- client logic against the test double ----

def fake_checks(browser):
    srv = fake_server.start(PAGE_SRC)
    port = srv.server_address[1]
    page = browser.page()
    try:
        fake_turns(page, srv, port)
    finally:
        page.ws.close()
        srv.shutdown()


def fake_turns(page, srv, port):
    check("double: page loads", open_page(page, f"http://127.0.0.1:{port}/"))
    time.sleep(0.2)
    check("double: model name shown",
          page.eval("document.getElementById('model').textContent")
          == "fake-model")
    set_number(page, "temperature", "0.3")
    set_number(page, "max-tokens", "17")
    type_prompt(page, "hi")
    click(page, "send")
    snap, _ = wait_reply(page, 1, timeout=20)
    want = "".join(fake_server.REPLY)
    kept = page.eval("JSON.parse(localStorage.getItem('loom-chat')).history")
    check("double: split SSE reassembled exactly", kept and kept[-1]["content"] == want,
          f"{kept!r} != {want!r}")
    check("double: raw HTML in a reply is shown as text",
          "<b>bold</b>" in snap.get("text", "") and "<img src=x" in snap.get("text", ""),
          repr(snap.get("text")))
    check("double: state done", snap.get("state") == "done", str(snap)[:300])
    check("double: usage used for the count",
          "6 tokens" in snap.get("status", ""), snap.get("status"))
    tags = page.eval("document.querySelectorAll('#log b, #log img').length")
    check("double: model output is not parsed as HTML",
          tags == 0 and page.eval("window.pwned === undefined"),
          f"{tags} elements")
    req = srv.requests[-1]
    check("double: request fields", req.get("stream") is True
          and req.get("temperature") == 0.3 and req.get("max_tokens") == 17
          and req.get("messages") == [{"role": "user", "content": "hi"}],
          json.dumps(req))

    type_prompt(page, "error")
    click(page, "send")
    snap, _ = wait_reply(page, 2, timeout=20)
    check("double: HTTP error shown", snap.get("state") == "error"
          and fake_server.ERROR_MSG in snap.get("note", "")
          and snap.get("role") == "alert", str(snap)[:300])
    check("double: failed prompt given back",
          page.eval("document.getElementById('prompt').value") == "error")

    type_prompt(page, "midway")
    click(page, "send")
    snap, _ = wait_reply(page, 3, timeout=20)
    check("double: in-stream error shown", snap.get("state") == "error"
          and "engine failed" in snap.get("note", "")
          and snap.get("text", "").strip() == "partial", str(snap)[:300])

    type_prompt(page, "second")
    press_enter(page)
    snap, _ = wait_reply(page, 4, timeout=20)
    roles = [m["role"] for m in srv.requests[-1]["messages"]]
    check("double: Enter sends, history kept, failed turn left out",
          snap.get("state") == "done" and roles == ["user", "assistant"] * 2
          + ["user"] and srv.requests[-1]["messages"][1]["content"] == want,
          json.dumps(srv.requests[-1]["messages"])[:400])

    # Earlier replies may be cut after [DONE] and close late, so look for
    # the abort of this very request ("slow"), not a count.
    aborted = srv.aborted
    type_prompt(page, "slow")
    click(page, "send")
    snap, _ = wait_reply(page, 5, timeout=20,
                         until=lambda s: len(s["text"]) > 8)
    check("double: buttons busy while streaming", snap.get("send") is True
          and snap.get("stop") is False, str(snap)[:300])
    click(page, "stop")
    snap, _ = wait_reply(page, 5, timeout=10)
    n = len(snap.get("text", ""))
    time.sleep(0.4)
    check("double: stop", snap.get("state") == "stopped"
          and len(page.eval(REPLY_JS)["text"]) == n, str(snap)[:300])
    # The fake server counts an abort only when a write fails, which a
    # stream that was never closed does not give: the wait can be long.
    end = time.time() + 30
    while "slow" not in srv.aborted_prompts and time.time() < end:
        time.sleep(0.05)
    check("double: stop closes the connection", "slow" in srv.aborted_prompts,
          f"aborted {aborted} -> {srv.aborted}: {srv.aborted_prompts}")

    # "New chat" while a reply streams: the late reply must not leak into
    # the new conversation.
    type_prompt(page, "slow")
    click(page, "send")
    wait_reply(page, 6, timeout=20, until=lambda s: len(s["text"]) > 4)
    click(page, "clear")
    time.sleep(0.3)
    check("double: new chat empties the log",
          page.eval("document.querySelectorAll('#log .msg').length") == 0)
    type_prompt(page, "hi")
    click(page, "send")
    snap, _ = wait_reply(page, 1, timeout=20)
    check("double: new chat starts a fresh history",
          snap.get("state") == "done" and srv.requests[-1]["messages"]
          == [{"role": "user", "content": "hi"}],
          json.dumps(srv.requests[-1]["messages"])[:300])
    markdown_turn(page, srv)
    reload_turns(page, srv, port)


SANITIZED_JS = """(() => {
  const all = document.querySelectorAll('#log .msg.assistant');
  const m = all[all.length - 1].querySelector('.text');
  const tags = (sel) => m.querySelectorAll(sel).length;
  return {h1: tags('h1'), strong: tags('strong'), em: tags('em'),
          table: tags('table td'), code: tags('pre > code.hljs'),
          keyword: tags('pre span.hljs-keyword'),
          script: tags('script'), img: tags('img'), iframe: tags('iframe'),
          onattr: [...m.querySelectorAll('*')].filter(
            (e) => [...e.attributes].some((a) => a.name.startsWith('on'))).length,
          hrefs: [...m.querySelectorAll('a')].map((a) => a.getAttribute('href')),
          rels: [...m.querySelectorAll('a[href]')].map((a) => a.rel),
          pwned: window.pwned === undefined ? null : window.pwned,
          text: m.textContent};
})()"""


def markdown_turn(page, srv):
    """Markdown renders (headings, emphasis, tables, highlighted code);
    nothing the model writes runs or loads."""
    n = page.eval("document.querySelectorAll('#log .msg.assistant').length")
    type_prompt(page, "markdown")
    click(page, "send")
    snap, _ = wait_reply(page, n + 1, timeout=20)
    time.sleep(0.2)
    r = page.eval(SANITIZED_JS)
    check("double: markdown rendered", snap.get("state") == "done" and r["h1"] == 1
          and r["strong"] >= 1 and r["em"] >= 1 and r["table"] == 2, str(r)[:400])
    check("double: code highlighted", r["code"] == 1 and r["keyword"] >= 1, str(r)[:400])
    check("double: no script, img, iframe or on* attribute reaches the page",
          r["script"] == 0 and r["img"] == 0 and r["iframe"] == 0 and r["onattr"] == 0,
          str(r)[:400])
    check("double: only http(s) links, opened safely",
          [h for h in r["hrefs"] if h] == ["https://example.com/x"]
          and r["rels"] == ["noopener noreferrer nofollow"], str(r["hrefs"]))
    check("double: nothing of the reply ran", r["pwned"] is None, str(r["pwned"]))
    check("double: hostile HTML shown as text", "<script>" in r["text"], r["text"][:400])
    screenshot(page, "chat_page_markdown.png")
    # the sanitizer alone, on HTML as hostile as a parser could hand it
    out = page.eval("""(() => {
      const doc = new DOMParser().parseFromString('<p onclick="window.pwned=8">a<img src=x onerror="window.pwned=9">'
        + '<script>window.pwned=10</script><a href="javascript:window.pwned=11" onmouseover="x">l</a>'
        + '<a href=" JaVaScRiPt:alert(1)">m</a><svg><script>window.pwned=12</script></svg>'
        + '<span class="hljs-string evil" style="x">s</span><iframe srcdoc="<b>"></iframe>'
        + '<form action="/x"><input name=q></form><b>kept</b></p>', 'text/html');
      const host = document.createElement('div');
      host.appendChild(sanitize(doc.body, document.createDocumentFragment()));
      return host.innerHTML;
    })()""")
    time.sleep(0.2)
    check("double: sanitize() keeps only the allowlist",
          # (the HTML parser closes the <p> at <form>)
          out == '<p>a<a>l</a><a>m</a><span class="hljs-string">s</span></p><b>kept</b><p></p>'
          and page.eval("window.pwned === undefined"), out)


def reload_turns(page, srv, port):
    """History, the system prompt and the API key survive a reload; the
    system prompt goes first; New chat forgets the history."""
    page.eval("document.getElementById('prefs').open = true")
    set_text(page, "system", "You are terse.")
    set_text(page, "api-key", "sk-test")
    n = page.eval("document.querySelectorAll('#log .msg.assistant').length")
    type_prompt(page, "hi")
    click(page, "send")
    wait_reply(page, n + 1, timeout=20)
    before = page.eval("document.querySelectorAll('#log .msg').length")
    check("double: reload loads", open_page(page, f"http://127.0.0.1:{port}/"))
    time.sleep(0.3)
    after = page.eval("document.querySelectorAll('#log .msg').length")
    check("double: messages restored after reload", before == after and after >= 4,
          f"{before} -> {after}")
    check("double: system prompt and key restored",
          page.eval("document.getElementById('system').value") == "You are terse."
          and page.eval("document.getElementById('api-key').value") == "sk-test")
    type_prompt(page, "again")
    click(page, "send")
    wait_reply(page, after // 2 + 1, timeout=20)
    msgs = srv.requests[-1]["messages"]
    check("double: system prompt first, history kept across the reload",
          msgs[0] == {"role": "system", "content": "You are terse."}
          and [m["role"] for m in msgs[1:]] == ["user", "assistant"] * (after // 2) + ["user"]
          and msgs[-1]["content"] == "again", json.dumps(msgs)[:400])
    check("double: API key sent as a Bearer token", srv.auth[-1] == "Bearer sk-test",
          str(srv.auth[-3:]))
    click(page, "clear")
    open_page(page, f"http://127.0.0.1:{port}/")
    time.sleep(0.3)
    check("double: New chat forgets the stored history",
          page.eval("document.querySelectorAll('#log .msg').length") == 0
          and page.eval("document.getElementById('system').value") == "You are terse.")


def main():
    if len(sys.argv) < 3:
        print("usage: test_chat_page.py LOOM_BINARY PAGE")
        return 2
    global PAGE_SRC
    loom = sys.argv[1]
    PAGE_SRC = sys.argv[2]
    model = os.environ.get("LOOM_MODEL", "")
    chromium = cdp.find_chromium()
    if not chromium:
        print("skip: no chromium binary installed (Debian package: chromium)")
        return 77
    if not model or not os.path.isfile(model):
        print(f"skip: model not found: {model or '$LOOM_MODEL unset'}")
        return 77
    tmp = tempfile.mkdtemp(prefix="loom-chat-page-")
    browser = cdp.Browser(chromium, tmp)
    try:
        real_server(browser, loom, model, tmp)
        fake_checks(browser)
    finally:
        browser.close()
        browser.remove_profile()
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
