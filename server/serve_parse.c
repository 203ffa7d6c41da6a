/* `loom serve`: the parse stage's workers (serve_parse.h).
 *
 * The queue is a list of clients, each with its own FIFO of items. A
 * worker takes the first item of the first client, then moves that client
 * to the end of the list (or drops it when it has nothing left): round
 * robin, so with k clients waiting a request waits for at most k - 1
 * others before its turn, whatever one client has queued. The bytes
 * queued are capped per client and in all (serve_parse.h). */
#include "serve_parse.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct parse_client {
	unsigned char key[PARSE_KEY_MAX];
	size_t key_len;
	unsigned long long bytes; /* queued */
	struct parse_item *head, *tail;
	struct parse_client *next;
};

struct parse_pool {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct parse_client *first, *last; /* clients with work, in turn order */
	bool stopping;
	unsigned long long bytes, cap_client, cap_total; /* queued, and the caps */
	int n;
	pthread_t threads[];
};

static struct parse_client *find_client(struct parse_pool *p, const struct parse_item *it)
{
	struct parse_client *c;

	for (c = p->first; c; c = c->next)
		if (c->key_len == it->key_len && !memcmp(c->key, it->key, it->key_len))
			return c;
	return NULL;
}

static void append_client(struct parse_pool *p, struct parse_client *c)
{
	c->next = NULL;
	if (p->last)
		p->last->next = c;
	else
		p->first = c;
	p->last = c;
}

/* The next item in turn, or NULL when none is queued (under p->mu). */
static struct parse_item *take(struct parse_pool *p)
{
	struct parse_client *c = p->first;
	struct parse_item *it;

	if (!c)
		return NULL;
	it = c->head;
	c->head = it->next;
	c->bytes -= it->bytes;
	p->bytes -= it->bytes;
	if (!c->head)
		c->tail = NULL;
	p->first = c->next;
	if (!p->first)
		p->last = NULL;
	if (c->head)
		append_client(p, c);
	else
		free(c);
	return it;
}

static void *worker(void *arg)
{
	struct parse_pool *p = arg;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		struct parse_item *it = take(p);

		if (!it && p->stopping)
			break;
		if (!it) {
			pthread_cond_wait(&p->cv, &p->mu);
			continue;
		}
		pthread_mutex_unlock(&p->mu);
		it->run(it);
		it->done(it);
		pthread_mutex_lock(&p->mu);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

void parse_pool_set_caps(struct parse_pool *p, unsigned long long per_client,
			 unsigned long long total)
{
	pthread_mutex_lock(&p->mu);
	p->cap_client = per_client ? per_client : PARSE_CLIENT_BYTES;
	p->cap_total = total ? total : PARSE_TOTAL_BYTES;
	pthread_mutex_unlock(&p->mu);
}

/* Whether n more bytes pass cap over queued (an empty queue takes one). */
static bool over(unsigned long long queued, size_t n, unsigned long long cap)
{
	return queued && (n > cap || queued > cap - n);
}

int parse_pool_submit(struct parse_pool *p, struct parse_item *it)
{
	struct parse_client *c;
	int rc = PARSE_STOPPING;

	if (it->key_len > PARSE_KEY_MAX)
		return PARSE_STOPPING;
	it->next = NULL;
	pthread_mutex_lock(&p->mu);
	if (p->stopping)
		goto out;
	c = find_client(p, it);
	rc = PARSE_FULL;
	if (over(p->bytes, it->bytes, p->cap_total) ||
	    (c && over(c->bytes, it->bytes, p->cap_client)))
		goto out;
	rc = PARSE_STOPPING;
	if (!c) {
		c = calloc(1, sizeof(*c));
		if (!c)
			goto out;
		memcpy(c->key, it->key, it->key_len);
		c->key_len = it->key_len;
		append_client(p, c);
	}
	if (c->tail)
		c->tail->next = it;
	else
		c->head = it;
	c->tail = it;
	c->bytes += it->bytes;
	p->bytes += it->bytes;
	pthread_cond_signal(&p->cv);
	rc = PARSE_QUEUED_OK;
out:
	pthread_mutex_unlock(&p->mu);
	return rc;
}

void parse_key_from_addr(struct parse_item *it, const struct sockaddr *sa)
{
	it->key_len = 0;
	if (sa && sa->sa_family == AF_INET) {
		it->key_len = 4;
		memcpy(it->key, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
		bool v4 = IN6_IS_ADDR_V4MAPPED(a);

		it->key_len = v4 ? 4 : 8;
		memcpy(it->key, a->s6_addr + (v4 ? 12 : 0), it->key_len);
	}
}

struct parse_pool *parse_pool_start(int n)
{
	struct parse_pool *p;

	if (n < 1)
		return NULL;
	p = calloc(1, sizeof(*p) + (size_t)n * sizeof(p->threads[0]));
	if (!p)
		return NULL;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->cap_client = PARSE_CLIENT_BYTES;
	p->cap_total = PARSE_TOTAL_BYTES;
	for (p->n = 0; p->n < n; p->n++) {
		if (pthread_create(&p->threads[p->n], NULL, worker, p)) {
			parse_pool_free(p);
			return NULL;
		}
	}
	return p;
}

void parse_pool_stop(struct parse_pool *p)
{
	int n;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stopping = true;
	n = p->n;
	p->n = 0; /* joined once */
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < n; i++)
		pthread_join(p->threads[i], NULL);
}

void parse_pool_free(struct parse_pool *p)
{
	if (!p)
		return;
	parse_pool_stop(p);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p);
}
