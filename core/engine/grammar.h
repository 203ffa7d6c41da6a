/* Grammar-constrained decoding (internal to the core).
 *
 * A grammar (struct loom_grammar, public and opaque: loom.h) is a set of
 * rules over bytes: each rule a list of alternatives, each alternative a
 * sequence of byte sets and references to rules. JSON Schema, "any JSON
 * object" and tool calls compile to one (grammar_json.c). A matcher runs
 * it as a pushdown automaton: its state is a set of stacks of positions
 * (several when the text so far is ambiguous), each stack's top a byte
 * set that the next byte must fall in; an empty stack means the text so
 * far is a complete sentence.
 *
 * Per decoding step the matcher masks the vocabulary: a token is allowed
 * iff all its bytes can be consumed from the current state. The tokens'
 * bytes sit in a trie (struct loom_gvocab, one per tokenizer), so a state
 * walks each shared prefix once and drops a whole subtree at the first
 * byte it cannot take. An end-of-generation token is allowed only where
 * the state is complete. Masks are cached by state (the state inside a
 * JSON string repeats for every token of the string).
 *
 * Everything here is used on one thread (the engine's) except the
 * compiled grammar, which is immutable and reference-counted.
 */
#ifndef LOOM_GRAMMAR_H
#define LOOM_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* Stacks one matcher state keeps: an enum or anyOf of more alternatives
 * open at once cannot be followed. JSON Schema compilation refuses such
 * a construct by this number; a matcher that still meets more (products
 * of nested alternatives) fails from then on (loom_gmatch_overflowed),
 * never dropping stacks silently. */
#define LOOM_GRAMMAR_MAX_STACKS 512

/* ---- building a grammar ---- */

/* An alternative under construction: a sequence of elements. */
struct gseq {
	int32_t *v;
	int32_t n, cap;
	bool oom;
};

struct gbuild;

struct gbuild *gbuild_new(void);
void gbuild_free(struct gbuild *b);
/* A new rule id with no alternatives yet (for recursion); -1 when out of
 * memory. */
int32_t gbuild_rule(struct gbuild *b);
/* Adds alternative s to rule r (s is taken: reset to empty). */
void gbuild_alt(struct gbuild *b, int32_t r, struct gseq *s);
/* Elements appended to s. */
void gseq_byte(struct gbuild *b, struct gseq *s, unsigned char c);
void gseq_lit(struct gbuild *b, struct gseq *s, const char *text, size_t n);
/* Bytes lo..hi (inclusive) except those in `except` (may be NULL). */
void gseq_range(struct gbuild *b, struct gseq *s, unsigned lo, unsigned hi,
		const char *except);
/* One byte of the NUL-terminated list chars. */
void gseq_chars(struct gbuild *b, struct gseq *s, const char *chars);
void gseq_ref(struct gseq *s, int32_t rule);
void gseq_free(struct gseq *s);
/* The grammar whose sentences are rule root's; b is consumed. NULL with
 * err set when out of memory or a rule has no alternative. */
struct loom_grammar *gbuild_finish(struct gbuild *b, int32_t root, char *err, size_t errlen);

struct loom_grammar *loom_grammar_ref(const struct loom_grammar *g);
int32_t loom_grammar_n_rules(const struct loom_grammar *g);

/* ---- the vocabulary ---- */

struct loom_gvocab;
/* The tokens' bytes in a trie; NULL when out of memory. */
struct loom_gvocab *loom_gvocab_new(const struct loom_tokenizer *t);
void loom_gvocab_free(struct loom_gvocab *v);

/* ---- matching ----
 *
 * A matcher keeps a current state (level 0) and up to 64 lookahead levels
 * (level i: the state after i more tokens), for speculative verification:
 * push the drafts, mask each row at its level, keep the level the
 * accepted tokens reach. A token tree (loom_gmatch_tree) makes one level
 * per node, each from its parent's level: level i is the state after row
 * i's own path. */
struct loom_gmatch;

struct loom_gmatch *loom_gmatch_new(const struct loom_grammar *g, const struct loom_gvocab *v);
void loom_gmatch_free(struct loom_gmatch *m);
/* Sets logits[t] (t < n_logits) to -INFINITY for every token t not
 * allowed at `level` (and every t the tokenizer does not have). Returns
 * the number of tokens allowed (0: nothing can follow), or -1 for a bad
 * level, out of memory or overflow (loom_gmatch_overflowed). */
int32_t loom_gmatch_mask(struct loom_gmatch *m, int32_t level, float *logits,
			 int32_t n_logits);
/* Advances the deepest level by token t into a new level. 0, or -1 when
 * the grammar does not allow t there (nothing changes), out of memory or
 * overflow.
 * An end-of-generation token is never pushed (nothing follows it). */
int loom_gmatch_push(struct loom_gmatch *m, int32_t t);
/* A token tree after level 0 (the committed state): row 0 is level 0,
 * row i (1..k) node tokens[i - 1] under row parent[i] < i (parent[0] =
 * -1). Drops the other levels, then keeps, in order, each node whose
 * parent was kept and whose token the grammar allows after its parent's
 * path; a refused node goes with its subtree. The kept nodes are
 * compacted in place (tokens[], parent[] renumbered); kept row r's level
 * is r: the state after r's own path, for masking row r and keeping the
 * accepted path's end. Returns the nodes kept (at most 64). */
int32_t loom_gmatch_tree(struct loom_gmatch *m, int32_t k, int32_t *tokens, int32_t *parent);
/* Makes `level` the current state and drops the others. */
void loom_gmatch_keep(struct loom_gmatch *m, int32_t level);
int32_t loom_gmatch_levels(const struct loom_gmatch *m); /* levels above 0 */
/* True when the text so far at level 0 is a complete sentence. */
bool loom_gmatch_done(const struct loom_gmatch *m);
/* True when some byte may follow at level 0. */
bool loom_gmatch_any_byte(const struct loom_gmatch *m);
/* Whether some state this matcher reached (level 0 at the start, a level
 * pushed or fed, or one a mask walked through) had more stacks than
 * LOOM_GRAMMAR_MAX_STACKS. Sticky: mask, push and feed then fail
 * (-1), and the caller names this as the reason. */
bool loom_gmatch_overflowed(const struct loom_gmatch *m);
/* Byte-level checks (tests, fuzzing): feeds text from level 0 without
 * tokens. 0 when every byte was accepted (the state advances), else -1
 * (state unchanged). */
int loom_gmatch_feed(struct loom_gmatch *m, const char *text, size_t n);

/* Mask cost counters (bench and docs). */
struct loom_gmatch_stats {
	uint64_t masks, cache_hits, nodes_visited;
};
void loom_gmatch_get_stats(const struct loom_gmatch *m, struct loom_gmatch_stats *st);

#endif /* LOOM_GRAMMAR_H */
