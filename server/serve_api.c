/* `loom serve`: the JSON of log-probabilities, embeddings, /tokenize and
 * /detokenize (pure functions of the tokenizer and the engine's numbers;
 * serve_http.c sends them). */
#include "serve_api.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "srv_util.h"

/* Bytes as a JSON string; bytes that are not UTF-8 become U+FFFD. */
json_t *api_text_json(const char *s, size_t n)
{
	json_t *v = json_stringn(s, n);
	struct sbuf b = { 0 };
	size_t i;

	if (v)
		return v;
	for (i = 0; i < n; i++) {
		if ((unsigned char)s[i] < 0x80)
			sb_putn(&b, s + i, 1);
		else
			sb_puts(&b, "\xef\xbf\xbd");
	}
	v = json_stringn(b.s ? b.s : "", b.len);
	sb_free(&b);
	return v;
}

static json_t *bytes_json(const char *s, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_integer((unsigned char)s[i]));
	return a;
}

/* A logprob as JSON: null for NAN (the first prompt token). */
static json_t *lp_json(float lp)
{
	return isnan(lp) ? json_null() : json_real(isinf(lp) ? -9999.0 : (double)lp);
}

/* {"token", "logprob", "bytes"} of one token. */
static json_t *token_entry(const struct loom_tokenizer *tok, int32_t id, float lp)
{
	size_t n = 0;
	const char *b = loom_token_bytes(tok, id, &n);

	if (!b)
		n = 0;
	return json_pack("{s:o,s:o,s:o}", "token", api_text_json(b ? b : "", n), "logprob",
			 lp_json(lp), "bytes", bytes_json(b ? b : "", n));
}

json_t *api_lp_item(const struct loom_tokenizer *tok, const struct loom_token_logprob *e,
		    int n_top, size_t offset)
{
	json_t *item = token_entry(tok, e[0].token, e[0].logprob), *top;

	if (!item)
		return NULL;
	top = isnan(e[0].logprob) && n_top > 0 ? json_null() : json_array();
	for (int k = 0; json_is_array(top) && k < n_top; k++)
		if (e[1 + k].token >= 0)
			json_array_append_new(top, token_entry(tok, e[1 + k].token, e[1 + k].logprob));
	json_object_set_new(item, "top_logprobs", top);
	json_object_set_new(item, "text_offset", json_integer((json_int_t)offset));
	return item;
}

json_t *api_chat_logprobs(json_t *items)
{
	json_t *content = json_array(), *it;
	size_t i;

	json_array_foreach(items, i, it) {
		json_t *c = json_deep_copy(it);

		json_object_del(c, "text_offset");
		json_array_append_new(content, c);
	}
	return json_pack("{s:o,s:n}", "content", content, "refusal");
}

json_t *api_completion_logprobs(json_t *items)
{
	json_t *tokens = json_array(), *lps = json_array(), *tops = json_array();
	json_t *offs = json_array(), *it;
	size_t i;

	json_array_foreach(items, i, it) {
		json_t *top = json_object_get(it, "top_logprobs"), *t;
		size_t k;

		json_array_append(tokens, json_object_get(it, "token"));
		json_array_append(lps, json_object_get(it, "logprob"));
		json_array_append(offs, json_object_get(it, "text_offset"));
		if (!json_is_array(top)) {
			json_array_append_new(tops, json_null());
			continue;
		}
		/* {token text: logprob}; two tokens with the same text keep
		 * the first (the more likely) */
		json_t *m = json_object();

		json_array_foreach(top, k, t) {
			const char *s = json_string_value(json_object_get(t, "token"));

			if (!json_object_get(m, s))
				json_object_set(m, s, json_object_get(t, "logprob"));
		}
		json_array_append_new(tops, m);
	}
	return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps,
			 "top_logprobs", tops, "text_offset", offs);
}

/* ---- embeddings ---- */

int api_pool(const float *rows, int32_t n, int32_t d, enum loom_pooling pooling, float *out)
{
	double norm = 0;
	int32_t i, k;

	if (n <= 0 || d <= 0)
		return -1;
	if (pooling == LOOM_POOLING_CLS || pooling == LOOM_POOLING_LAST) {
		const float *r = rows + (size_t)(pooling == LOOM_POOLING_CLS ? 0 : n - 1) * (size_t)d;

		memcpy(out, r, sizeof(float) * (size_t)d);
	} else {
		for (k = 0; k < d; k++) {
			double sum = 0;

			for (i = 0; i < n; i++)
				sum += rows[(size_t)i * (size_t)d + (size_t)k];
			out[k] = (float)(sum / n);
		}
	}
	for (k = 0; k < d; k++)
		norm += (double)out[k] * out[k];
	norm = sqrt(norm);
	if (!(norm > 0) || !isfinite(norm))
		return -1;
	for (k = 0; k < d; k++)
		out[k] = (float)(out[k] / norm);
	return 0;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The floats' little-endian bytes in base64, as OpenAI sends them. */
static json_t *base64_floats(const float *v, int32_t d)
{
	const unsigned char *p = (const unsigned char *)v; /* x86/arm64: little-endian */
	size_t n = (size_t)d * sizeof(float), i, o = 0;
	char *s = malloc((n + 2) / 3 * 4 + 1);
	json_t *j;

	if (!s)
		return NULL;
	for (i = 0; i < n; i += 3) {
		uint32_t x = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
			     (i + 2 < n ? p[i + 2] : 0);

		s[o++] = b64[x >> 18 & 63];
		s[o++] = b64[x >> 12 & 63];
		s[o++] = i + 1 < n ? b64[x >> 6 & 63] : '=';
		s[o++] = i + 2 < n ? b64[x & 63] : '=';
	}
	s[o] = '\0';
	j = json_string(s);
	free(s);
	return j;
}

json_t *api_embedding_item(int index, const float *v, int32_t d, bool base64)
{
	json_t *e;

	if (base64) {
		e = base64_floats(v, d);
	} else {
		e = json_array();
		for (int32_t k = 0; k < d; k++)
			json_array_append_new(e, json_real(v[k]));
	}
	return json_pack("{s:s,s:i,s:o}", "object", "embedding", "index", index, "embedding", e);
}

/* ---- /tokenize and /detokenize (llama-server's shapes) ---- */

/* What /tokenize and /detokenize show of a token: its bytes, or for a
 * control token (no bytes) its text, "<|im_start|>", as llama-server. */
static const char *shown_piece(const struct loom_tokenizer *tok, int32_t id, size_t *n)
{
	const char *b = loom_token_bytes(tok, id, n);

	if (b && *n == 0 && (b = loom_token_text(tok, id)))
		*n = strlen(b);
	return b ? b : (*n = 0, "");
}

/* A piece: its text when it is whole UTF-8, else its bytes. */
static json_t *piece_json(const struct loom_tokenizer *tok, int32_t id)
{
	size_t n = 0;
	const char *b = shown_piece(tok, id, &n);
	json_t *s = json_stringn(b, n);

	return s ? s : bytes_json(b, n);
}

static json_t *load_object(const char *body, size_t len, struct perr *e)
{
	json_error_t jerr;
	json_t *o = json_loadb(body, len, 0, &jerr);

	if (!o) {
		perr_set(e, 400, NULL, "invalid_json", "invalid JSON at line %d column %d: %s",
			 jerr.line, jerr.column, jerr.text);
		return NULL;
	}
	if (!json_is_object(o)) {
		json_decref(o);
		perr_set(e, 400, NULL, "invalid_json", "the request body must be a JSON object");
		return NULL;
	}
	return o;
}

json_t *api_tokenize(const struct loom_tokenizer *tok, const char *body, size_t len,
		     struct perr *e)
{
	json_t *o = load_object(body, len, e), *c, *out = NULL;
	bool add_special = false, pieces = false;
	int32_t *ids = NULL;
	int64_t n;

	if (!o)
		return NULL;
	c = req_member(o, "content");
	if (!c || !json_is_string(c)) {
		perr_set(e, 400, "content", c ? "invalid_type" : "missing",
			 "'content' must be a string");
		goto out;
	}
	if (req_get_bool(o, "add_special", &add_special, e) ||
	    req_get_bool(o, "with_pieces", &pieces, e))
		goto out;
	/* as a completion's prompt: special-token text becomes the token */
	n = loom_tokenize(tok, json_string_value(c), json_string_length(c), add_special, true,
			  NULL, 0);
	if (n < 0 || !(ids = malloc(sizeof(int32_t) * (size_t)(n + 1))) ||
	    loom_tokenize(tok, json_string_value(c), json_string_length(c), add_special, true,
			  ids, n) != n) {
		perr_set(e, n < 0 ? 400 : 500, "content", NULL, "the content could not be tokenized");
		goto out;
	}
	out = json_array();
	for (int64_t i = 0; i < n; i++)
		json_array_append_new(out, pieces ? json_pack("{s:i,s:o}", "id", ids[i], "piece",
							      piece_json(tok, ids[i]))
						  : json_integer(ids[i]));
	out = json_pack("{s:o}", "tokens", out);
out:
	free(ids);
	json_decref(o);
	return out;
}

json_t *api_detokenize(const struct loom_tokenizer *tok, const char *body, size_t len,
		       struct perr *e)
{
	json_t *o = load_object(body, len, e), *t, *x, *out = NULL;
	struct loom_detok dt = { .first = true };
	struct sbuf text = { 0 };
	int32_t nv = loom_tokenizer_n_vocab(tok);
	size_t i, n;

	if (!o)
		return NULL;
	t = req_member(o, "tokens");
	if (!t || !json_is_array(t)) {
		perr_set(e, 400, "tokens", t ? "invalid_type" : "missing",
			 "'tokens' must be an array of token ids");
		goto out;
	}
	json_array_foreach(t, i, x) {
		if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= nv) {
			perr_set(e, 400, "tokens", "invalid_value",
				 "tokens[%zu] is not a token id in [0, %d)", i, nv);
			goto out;
		}
	}
	json_array_foreach(t, i, x) {
		int32_t id = (int32_t)json_integer_value(x);
		char *buf;
		int got;

		if (loom_token_bytes(tok, id, &n) && n == 0) { /* a control token */
			const char *b = shown_piece(tok, id, &n);

			sb_putn(&text, b, n);
			continue;
		}
		buf = malloc(n + 16); /* the piece and a held-back character */
		got = buf ? loom_detokenize(tok, &dt, id, buf, n + 16) : -1;
		if (got > 0)
			sb_putn(&text, buf, (size_t)got);
		free(buf);
		if (got < 0) {
			perr_set(e, 500, NULL, NULL, "out of memory");
			goto out;
		}
	}
	if (dt.n_pending) /* a character the tokens leave unfinished */
		sb_puts(&text, "\xef\xbf\xbd");
	out = json_pack("{s:o}", "content", api_text_json(text.s ? text.s : "", text.len));
out:
	sb_free(&text);
	json_decref(o);
	return out;
}
