/* `loom serve`: an OpenAI-compatible HTTP server over the scheduler. */
#ifndef LOOM_SERVE_H
#define LOOM_SERVE_H

#include <stddef.h>

/* argv[1] is "serve". Returns 0 after a clean shutdown (SIGTERM/SIGINT),
 * -1 with the reason in err. */
int loom_serve_main(int argc, char **argv, char *err, size_t errlen);

#endif
