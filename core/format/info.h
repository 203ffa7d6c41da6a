/* `loom info`: a human-readable summary of a GGUF file (internal). */
#ifndef LOOM_INFO_H
#define LOOM_INFO_H

#include <stddef.h>
#include <stdio.h>

/* loom_info_print is public: see loom.h. */
#include "loom.h"

#endif
