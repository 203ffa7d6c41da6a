/* `loom serve`: the parse stage's workers (serve_parse.h).
 *
 * The queue is a list of clients, each with its own FIFO of items. A
 * worker takes the first item of the first client, then moves that client
 * to the end of the list (or drops it when it has nothing left): round
 * robin, so with k clients waiting a request waits for at most k - 1
 * others before its turn, whatever one client has queued. */
#include "serve_parse.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct parse_client {
	unsigned char key[PARSE_KEY_MAX];
	size_t key_len;
	struct parse_item *head, *tail;
	struct parse_client *next;
};

struct parse_pool {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct parse_client *first, *last; /* clients with work, in turn order */
	bool stopping;
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

int parse_pool_submit(struct parse_pool *p, struct parse_item *it)
{
	struct parse_client *c;
	int rc = -1;

	if (it->key_len > PARSE_KEY_MAX)
		return -1;
	it->next = NULL;
	pthread_mutex_lock(&p->mu);
	if (p->stopping)
		goto out;
	c = find_client(p, it);
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
	pthread_cond_signal(&p->cv);
	rc = 0;
out:
	pthread_mutex_unlock(&p->mu);
	return rc;
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
