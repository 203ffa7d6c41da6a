/* `loom imatrix`: calibration statistics for quantization. */
#ifndef LOOM_TOOLS_IMATRIX_H
#define LOOM_TOOLS_IMATRIX_H

#include <stddef.h>

#include "options.h"

/* Runs the model over text[0..len) in chunks of -c tokens (--chunks at
 * most) and writes o->imatrix_out (with Hessians for --hessian). 0, or -1
 * with err set. */
int loom_imatrix_main(const struct loom_options *o, const char *text, size_t len, char *err,
		      size_t errlen);

/* `loom imatrix --show FILE`: one line per entry. 0, or -1 with err. */
int loom_imatrix_show(const char *path, char *err, size_t errlen);

#endif
