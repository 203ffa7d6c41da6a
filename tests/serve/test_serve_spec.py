"""`loom serve` with speculative decoding per request (--spec=ngram.so).

argv[1] is the loom binary; the model is $LOOM_MODEL (skip, exit 77, when
absent). The oracle is the same server's plain greedy answer: the server
runs its backend batch-invariant, so a speculating greedy request must give
exactly the plain text, streamed or not, alone or among others. Also:
unknown strategy names are a 400 that lists the offered ones, draft.so
without --spec-draft-model is refused at start-up naming the file, draft.so
with the target as its own draft model gives the plain text, layerskip.so
(early exit, run by the scheduler per sequence) gives the plain text alone
and concurrently, and /metrics counts drafts per strategy.
"""
import json
import os
import subprocess
import sys
import threading
import time

import test_serve as ts
from test_serve import LOOM, MODEL, Server, check, stream_text

PARAS = [
    "The quick brown fox jumps over the lazy dog near the river bank, while the farmer "
    "watches from the old wooden fence and counts his sheep one by one.",
    "To bake bread, mix flour, water, salt and yeast, knead the dough for ten minutes, "
    "let it rise for an hour, then bake it at two hundred degrees until golden.",
    "The library opens at nine, closes at six on weekdays and at noon on Saturdays; "
    "books may be borrowed for three weeks and renewed twice online.",
    "Our meeting on Monday covers the budget, the hiring plan for the spring, the new "
    "office in Berlin and the schedule for the product launch in June.",
]


def copy_req(i, **extra):
    msg = "Repeat the following text exactly, word for word:\n" + PARAS[i % len(PARAS)]
    return dict({"messages": [{"role": "user", "content": msg}], "max_tokens": 96,
                 "temperature": 0}, **extra)


def text_of(r):
    return r["choices"][0]["message"]["content"]


def spec_metrics(srv, name="ngram"):
    m = srv.metrics()
    return {k: m.get(f'loom_spec_{k}{{strategy="{name}"}}', 0.0)
            for k in ("steps_total", "drafted_tokens_total", "accepted_tokens_total",
                      "generated_tokens_total")}


def same_text(srv):
    """Greedy text with and without ngram, streaming and not."""
    before = spec_metrics(srv)
    for i in range(len(PARAS)):
        plain = text_of(srv.chat(**copy_req(i)))
        check(f"copy {i}: plain answer is long", len(plain) > 40, plain)
        fast = text_of(srv.chat(**copy_req(i, speculative="ngram")))
        check(f"copy {i}: ngram == plain", fast == plain, f"{fast!r} vs {plain!r}")
        obj = text_of(srv.chat(**copy_req(i, spec={"name": "ngram.so", "max_draft": 3})))
        check(f"copy {i}: spec object == plain", obj == plain, f"{obj!r} vs {plain!r}")
        st, fin, _, _ = stream_text(srv, "/v1/chat/completions", copy_req(i, speculative="ngram"))
        check(f"copy {i}: streamed ngram == plain", st == plain, f"{st!r} vs {plain!r}")
        check(f"copy {i}: finish", fin.get(0) in ("stop", "length"), fin)
    after = spec_metrics(srv)
    check("metrics: steps counted", after["steps_total"] > before["steps_total"], after)
    check("metrics: drafts accepted", after["accepted_tokens_total"] > before["accepted_tokens_total"],
          after)
    check("metrics: accepted <= drafted",
          after["accepted_tokens_total"] <= after["drafted_tokens_total"], after)
    check("metrics: tokens = steps + accepted",
          after["generated_tokens_total"] == after["steps_total"] + after["accepted_tokens_total"],
          after)
    m = srv.metrics()
    check("metrics: acceptance rate in (0, 1]",
          0 < m.get('loom_spec_acceptance_rate{strategy="ngram"}', 0) <= 1, m)


def concurrent(srv):
    """8 requests at once, half speculating, each equal to its plain text alone."""
    want = [text_of(srv.chat(**copy_req(i))) for i in range(len(PARAS))]
    got = [None] * 8
    errs = []

    def one(k):
        try:
            req = copy_req(k, speculative="ngram") if k % 2 == 0 else copy_req(k)
            got[k] = text_of(srv.chat(**req))
        except Exception as e:  # noqa: BLE001
            errs.append(repr(e))

    th = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    check("concurrent: no errors", not errs, errs)
    for k in range(8):
        check(f"concurrent {k}: == plain alone", got[k] == want[k % len(PARAS)],
              f"{got[k]!r} vs {want[k % len(PARAS)]!r}")


def bad_names(srv):
    for body in ({"speculative": "nope"}, {"spec": {"name": "layerskip"}},
                 {"speculative": 3}, {"spec": {"name": "ngram", "max_draft": 0}}):
        st, _, raw = srv.post("/v1/chat/completions", copy_req(0, **body))
        check(f"bad spec {body}: 400", st == 400, (st, raw[:300]))
        if isinstance(body.get("speculative", body.get("spec")), str) or "layerskip" in str(body):
            msg = json.loads(raw)["error"]["message"]
            check(f"bad spec {body}: names the offered ones", "ngram" in msg, msg)
    r = srv.chat(**copy_req(0, speculative="none"))
    check("speculative none works", len(text_of(r)) > 0, r)


def no_spec_server():
    srv = Server("--ctx-size", "1024", "--parallel", "4")
    try:
        st, _, raw = srv.post("/v1/chat/completions", copy_req(0, speculative="ngram"))
        check("no --spec: 400", st == 400, (st, raw[:300]))
        check("no --spec: says how", b"--spec" in raw, raw[:300])
        check("no --spec: no spec metrics", not any(k.startswith("loom_spec_")
                                                    for k in srv.metrics()), "")
    finally:
        srv.stop()


def default_server():
    """--spec-default=ngram (INI keys): requests speculate unless they say none."""
    with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"spec_{os.getpid()}.ini"), "w") as f:
        f.write("[serve]\nspec = ngram.so\nspec_default = ngram\nspec_max_draft = 6\n")
        ini = f.name
    srv = Server("--ctx-size", "1024", "--parallel", "4", "--config", ini)
    try:
        a = spec_metrics(srv)
        plain = text_of(srv.chat(**copy_req(1, speculative="none")))
        b = spec_metrics(srv)
        check("default: 'none' does not speculate", b["steps_total"] == a["steps_total"], b)
        fast = text_of(srv.chat(**copy_req(1)))
        c = spec_metrics(srv)
        check("default: speculates", c["accepted_tokens_total"] > b["accepted_tokens_total"], c)
        check("default: same text", fast == plain, f"{fast!r} vs {plain!r}")
    finally:
        srv.stop()
        os.unlink(ini)


def layerskip_server():
    """--spec=layerskip.so: the same greedy text as plain, alone, streamed and
    4 at once (--spec-step-rows 0: all of them draft in the same steps)."""
    srv = Server("--ctx-size", "1024", "--parallel", "4", "--spec=ngram.so,layerskip.so",
                 "--spec-layers", "28", "--spec-step-rows", "0")
    try:
        want = [text_of(srv.chat(**copy_req(i))) for i in range(len(PARAS))]
        a = spec_metrics(srv, "layerskip")
        one = text_of(srv.chat(**copy_req(0, speculative="layerskip")))
        check("layerskip alone: == plain", one == want[0], f"{one!r} vs {want[0]!r}")
        txt, _, _, _ = stream_text(srv, "/v1/chat/completions",
                                   copy_req(1, speculative="layerskip"))
        check("layerskip streamed: == plain", txt == want[1], (txt, want[1]))
        got, errs = [None] * 4, []

        def one_req(k):
            try:
                got[k] = text_of(srv.chat(**copy_req(k, speculative="layerskip")))
            except Exception as e:  # noqa: BLE001
                errs.append(repr(e))

        th = [threading.Thread(target=one_req, args=(k,)) for k in range(4)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        check("layerskip concurrent: no errors", not errs, errs)
        for k in range(4):
            check(f"layerskip concurrent {k}: == plain", got[k] == want[k],
                  f"{got[k]!r} vs {want[k]!r}")
        b = spec_metrics(srv, "layerskip")
        check("layerskip: drafts verified", b["drafted_tokens_total"] > a["drafted_tokens_total"], b)
        check("layerskip: drafts accepted", b["accepted_tokens_total"] > a["accepted_tokens_total"], b)
        check("layerskip: server exits 0", srv.stop() == 0, srv.stderr()[-500:])
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def draft_server():
    """draft.so with the target as its own draft model (every draft is the
    target's choice): the plain text, alone and 4 at once, drafts accepted."""
    srv = Server("--ctx-size", "1024", "--parallel", "4", "--spec=draft.so",
                 "--spec-draft-model", MODEL, "--spec-step-rows", "0")
    try:
        want = [text_of(srv.chat(**copy_req(i))) for i in range(len(PARAS))]
        got, errs = [None] * 4, []

        def one_req(k):
            try:
                got[k] = text_of(srv.chat(**copy_req(k, speculative="draft")))
            except Exception as e:  # noqa: BLE001
                errs.append(repr(e))

        one_req(0)
        check("draft alone: == plain", got[0] == want[0], f"{got[0]!r} vs {want[0]!r}")
        th = [threading.Thread(target=one_req, args=(k,)) for k in range(4)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        check("draft concurrent: no errors", not errs, errs)
        for k in range(4):
            check(f"draft concurrent {k}: == plain", got[k] == want[k],
                  f"{got[k]!r} vs {want[k]!r}")
        m = spec_metrics(srv, "draft")
        check("draft: drafts accepted", m["accepted_tokens_total"] > 0, m)
        check("draft: server exits 0", srv.stop() == 0, srv.stderr()[-500:])
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def refused_at_start():
    for args, words in ((["--spec=draft.so"], ["draft.so", "draft model"]),
                        (["--spec=draft.so", "--spec-draft-model", "/nonexistent.gguf"],
                         ["/nonexistent.gguf"]),
                        (["--spec=layerskip.so", "--spec-layers", "31"], ["spec_layers", "31"]),
                        (["--spec=ngram.so,nosuch.so"], ["nosuch.so", "not found"]),
                        (["--spec=ngram.so,ngram"], ["twice"]),
                        (["--spec=ngram.so", "--spec-default=other"], ["other"])):
        p = subprocess.run([LOOM, "serve", "--model", MODEL, "--port", "0", *args],
                           capture_output=True, text=True, timeout=120)
        check(f"{args}: refused", p.returncode != 0, p.stderr[-300:])
        check(f"{args}: says why", all(w in p.stderr for w in words), p.stderr[-300:])


def main():
    if not MODEL or not os.path.exists(MODEL):
        print(f"skip: model not found ({MODEL or '$LOOM_MODEL unset'})")
        return 77
    srv = Server("--ctx-size", "1024", "--parallel", "8", "--spec=ngram.so")
    try:
        for test in (same_text, concurrent, bad_names):
            t0 = time.time()
            try:
                test(srv)
            except Exception as e:  # noqa: BLE001
                check(test.__name__, False, f"raised {e!r}")
            print(f"{test.__name__}: {time.time() - t0:.1f} s", flush=True)
        check("server exits 0", srv.stop() == 0, srv.stderr()[-500:])
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    for test in (no_spec_server, default_server, layerskip_server, draft_server,
                 refused_at_start):
        t0 = time.time()
        try:
            test()
        except Exception as e:  # noqa: BLE001
            check(test.__name__, False, f"raised {e!r}")
        print(f"{test.__name__}: {time.time() - t0:.1f} s", flush=True)
    print(f"{ts.passed} passed, {len(ts.failures)} failed")
    return 1 if ts.failures else 0


if __name__ == "__main__":
    sys.exit(main())
