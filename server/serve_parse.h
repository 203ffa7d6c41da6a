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

/* Bodies waiting for a worker hold memory while their connections are
 * suspended (and exempt from the idle timeout): what is queued is capped
 * per client key and in all (--max-queued-bytes-per-client,
 * --max-queued-bytes). An empty queue always takes one item, whatever
 * its size, so a body under --max-body is never refused forever. */
#define PARSE_CLIENT_BYTES (16ull << 20)
#define PARSE_TOTAL_BYTES (128ull << 20)

/* parse_pool_submit's answers */
enum { PARSE_QUEUED_OK = 0, PARSE_STOPPING = -1, PARSE_FULL = -2 };

/* One unit of work, embedded in its owner's struct. */
struct parse_item {
	/* set by the owner before submitting */
	unsigned char key[PARSE_KEY_MAX]; /* the client it is queued under */
	size_t key_len;
	size_t bytes; /* what it holds (its body), counted while queued */
	void (*run)(struct parse_item *it); /* on a worker */
	void (*done)(struct parse_item *it); /* on a worker, after run */
	/* the pool's */
	struct parse_item *next;
};

struct parse_pool;
struct sockaddr;

/* it->key from a client's address: an IPv4 address; an IPv6 address's
 * /64 prefix (one host commonly holds a whole /64); an IPv4-mapped IPv6
 * address (::ffff:a.b.c.d) as its IPv4 address; else the empty key. */
void parse_key_from_addr(struct parse_item *it, const struct sockaddr *sa);

/* n worker threads; NULL when they cannot be started. */
struct parse_pool *parse_pool_start(int n);
/* The caps on queued bytes (0: the default above); before any submit. */
void parse_pool_set_caps(struct parse_pool *p, unsigned long long per_client,
			 unsigned long long total);
/* Queues it: PARSE_QUEUED_OK; PARSE_STOPPING once the pool is stopping;
 * PARSE_FULL when its bytes would pass a cap (answer 503, retry later).
 * Nothing is queued unless PARSE_QUEUED_OK. */
int parse_pool_submit(struct parse_pool *p, struct parse_item *it);
/* Runs what is queued and joins the workers; later submits are refused.
 * The pool stays valid for them until parse_pool_free. */
void parse_pool_stop(struct parse_pool *p);
/* Stops the pool if it runs, and frees it (NULL-safe). */
void parse_pool_free(struct parse_pool *p);

#endif /* LOOM_SERVE_PARSE_H */
