/* libFuzzer: the config file reader (tools/options.c over inih) and the
 * option values it parses.
 *
 * The input is written to a memory file and read as `--config FILE`; a
 * refusal must name the file. Then each line "key=value" of it is applied
 * with loom_options_set for each subcommand's view of the options.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "options.h"

static const enum loom_cmd cmds[] = { 0, LOOM_CMD_RUN, LOOM_CMD_SERVE, LOOM_CMD_CHAT };

static void set_lines(struct loom_options *o, const uint8_t *data, size_t size)
{
	char line[512], err[512];
	size_t i = 0;

	while (i < size) {
		const uint8_t *nl = memchr(data + i, '\n', size - i);
		size_t n = nl ? (size_t)(nl - data - i) : size - i;
		char *eq;

		if (n < sizeof(line)) {
			memcpy(line, data + i, n);
			line[n] = '\0';
			if ((eq = strchr(line, '='))) {
				*eq = '\0';
				(void)loom_options_set(o, line, eq + 1, err, sizeof(err));
			}
		}
		i += n + 1;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct loom_options *o = malloc(sizeof(*o));
	char path[64], err[1024];
	int fd = memfd_create("loom-fuzz-ini", 0);

	if (fd < 0 || !o || (size && write(fd, data, size) != (ssize_t)size))
		abort();
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	for (size_t k = 0; k < sizeof(cmds) / sizeof(cmds[0]); k++) {
		loom_options_defaults(o);
		o->cmd = cmds[k];
		err[0] = '\0';
		if (loom_options_load_ini(o, path, err, sizeof(err)) && !strstr(err, path))
			abort(); /* a refusal names the file */
		loom_options_defaults(o);
		o->cmd = cmds[k];
		set_lines(o, data, size);
	}
	close(fd);
	free(o);
	return 0;
}
