/* Layout tables for tests/abi/abi_layout.c. */
#ifndef LOOM_TEST_ABI_LAYOUT_H
#define LOOM_TEST_ABI_LAYOUT_H

#include <stddef.h>

struct abi_member {
	const char *s, *m;
	size_t off, size;
};

struct abi_struct {
	const char *s;
	size_t size;
};

extern const struct abi_member abi_members_v1_0[], abi_members_now[];
extern const struct abi_struct abi_structs_v1_0[], abi_structs_now[];

#endif
