/* Offsets and sizes of the generation-1.0 ABI structs as the frozen 1.0
 * headers lay them out (tests/abi/v1_0). */
#include <stddef.h>

#include "loom/backend.h"
#include "abi_layout.h"

#define X(s, m) { #s, #m, offsetof(struct s, m), sizeof(((struct s *)0)->m) },
const struct abi_member abi_members_v1_0[] = {
#include "members_v1_0.h"
	{ NULL, NULL, 0, 0 },
};
#undef X

#define S(s) { #s, sizeof(struct s) },
const struct abi_struct abi_structs_v1_0[] = {
#include "structs_v1_0.h"
	{ NULL, 0 },
};
#undef S
