/* Offsets and sizes of the same members and structs as today's headers
 * (include/) lay them out. */
#include <stddef.h>

#include "loom/backend.h"
#include "abi_layout.h"

#define X(s, m) { #s, #m, offsetof(struct s, m), sizeof(((struct s *)0)->m) },
const struct abi_member abi_members_now[] = {
#include "members_v1_0.h"
	{ NULL, NULL, 0, 0 },
};
#undef X

#define S(s) { #s, sizeof(struct s) },
const struct abi_struct abi_structs_now[] = {
#include "structs_v1_0.h"
	{ NULL, 0 },
};
#undef S
