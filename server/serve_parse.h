/* `loom serve`: the parse stage. Request bodies are parsed, rendered and
 * tokenized by a few worker threads, not by MHD's event loops, so a big
 * request delays neither /health nor any other connection. Work is taken
 * round robin across client addresses: a client that floods the server
 * waits behind its own requests, not in front of everyone else's. */
#ifndef LOOM_SERVE_PARSE_H
#define LOOM_SERVE_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#define PARSE_KEY_MAX 16 /* an IPv6 address */

/* One unit of work, embedded in its owner's struct. */
struct parse_item {
	/* set by the owner before submitting */
	unsigned char key[PARSE_KEY_MAX]; /* the client it is queued under */
	size_t key_len;
	void (*run)(struct parse_item *it); /* on a worker */
	void (*done)(struct parse_item *it); /* on a worker, after run */
	/* the pool's */
	struct parse_item *next;
};

struct parse_pool;

/* n worker threads; NULL when they cannot be started. */
struct parse_pool *parse_pool_start(int n);
/* Queues it: 0, or -1 (nothing queued) once the pool is stopping. */
int parse_pool_submit(struct parse_pool *p, struct parse_item *it);
/* Runs what is queued and joins the workers; later submits are refused.
 * The pool stays valid for them until parse_pool_free. */
void parse_pool_stop(struct parse_pool *p);
/* Stops the pool if it runs, and frees it (NULL-safe). */
void parse_pool_free(struct parse_pool *p);

#endif /* LOOM_SERVE_PARSE_H */
