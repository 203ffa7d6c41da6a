/*
 * cpu.so's configuration (docs/BACKENDS.md, "cpu.so configuration"): a
 * host's loom_backend_config is read field by field as far as its
 * struct_size reaches, so an older host's shorter struct is accepted for
 * what it holds, and a field it lacks keeps its default.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "plugin/backend_loader.h"

/* Opens cpu.so with cfg cut to size bytes; writes the device name (or
 * the error) to name. Whether it opened. */
static int open_cut(const struct loom_backend_config *cfg, size_t size, char *name, size_t cap)
{
	struct loom_backend_config c = *cfg;
	struct loom_device_info info;
	struct loom_backend *b;
	char err[4096];

	c.struct_size = (uint32_t)size;
	b = loom_backend_open("cpu.so", &c, err, sizeof(err));
	if (!b) {
		snprintf(name, cap, "%s", err);
		return 0;
	}
	if (b->ops->device_info(b->ctx, &info))
		snprintf(name, cap, "device_info failed");
	else
		snprintf(name, cap, "%s", info.name);
	loom_backend_close(b);
	return 1;
}

static int expect(int ok, const char *what, const char *name)
{
	printf("%s %s: %s\n", ok ? "ok  " : "FAIL", what, name);
	return !ok;
}

int main(void)
{
	const size_t to_threads = offsetof(struct loom_backend_config, n_threads) + 4;
	const size_t to_device = offsetof(struct loom_backend_config, device) + 4;
	struct loom_backend_config cfg = { .struct_size = sizeof(cfg), .n_threads = 3 };
	char name[4200], want[64];
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int bad = 0, ok;

	setvbuf(stdout, NULL, _IOLBF, 0);
	ok = open_cut(&cfg, sizeof(cfg), name, sizeof(name));
	if (!ok) {
		printf("SKIP: cpu.so: %s\n", name);
		return 77;
	}
	bad += expect(strstr(name, ", 3 threads)") != NULL, "whole struct, 3 threads", name);
	/* an older host's struct without flags still sets the threads */
	ok = open_cut(&cfg, to_threads, name, sizeof(name));
	bad += expect(ok && strstr(name, ", 3 threads)"), "struct up to n_threads", name);
	/* one without n_threads: a thread per online CPU */
	snprintf(want, sizeof(want), ", %ld threads)", ncpu > 256 ? 256 : ncpu);
	ok = open_cut(&cfg, to_device, name, sizeof(name));
	bad += expect(ok && strstr(name, want), "struct up to device", name);
	ok = open_cut(&cfg, sizeof(uint32_t), name, sizeof(name));
	bad += expect(ok && strstr(name, want), "struct_size alone", name);
	/* the device field is read, and refused, whenever the struct has it */
	cfg.device = 1;
	ok = open_cut(&cfg, to_device, name, sizeof(name));
	bad += expect(!ok, "device 1 in a short struct refused", name);
	ok = open_cut(&cfg, sizeof(uint32_t), name, sizeof(name));
	bad += expect(ok, "device beyond struct_size not read", name);
	printf("%d failed\n", bad);
	return bad ? 1 : 0;
}
