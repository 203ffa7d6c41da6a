/* Checks on a plugin's file and on the pointers it hands the host
 * (internal; loader.c and the per-kind checks use them).
 *
 * A plugin is untrusted input: its entry may return a wild pointer, a
 * table of garbage, or a symbol that is not code. Before the host reads
 * a byte through such a pointer or calls through a slot, these say
 * whether it lies inside a segment of a loaded object with the needed
 * permissions, from the program headers (dl_iterate_phdr). Heap memory
 * never passes: descriptors are const data of the plugin.
 */
#ifndef LOOM_PLUGIN_MAPCHECK_H
#define LOOM_PLUGIN_MAPCHECK_H
#include <stdbool.h>
#include <stddef.h>

/* [p, p + len) lies inside one readable segment of the object dlopen
 * returned as dl (NULL: of any loaded object); with exec, one that is
 * also executable. The loader passes the plugin's handle: a slot or a
 * table must lie in the plugin's own object, not in libc or another
 * library it happens to reach. */
bool loom_map_in_object(void *dl, const void *p, size_t len, bool exec);
/* [p, p + len) lies inside one readable segment of any loaded object. */
bool loom_map_readable(const void *p, size_t len);
/* fn points into an executable segment of any loaded object. */
bool loom_map_code(const void *fn);
/* s is readable (in dl's object; NULL: any) and NUL-terminated within
 * max bytes. */
bool loom_map_string_in(void *dl, const char *s, size_t max);
bool loom_map_string(const char *s, size_t max);
/* sym lies in an executable segment and, where the dynamic symbol table
 * names that exact address, the symbol is a function (STT_FUNC or an
 * ifunc), not a data object. */
bool loom_map_is_function(const void *sym);

enum elf_verdict {
	ELF_OK,
	ELF_UNREADABLE,  /* errno set by open */
	ELF_NOT_SHARED,  /* not ELF, truncated, or not ET_DYN */
	ELF_FOREIGN,     /* why: "built for aarch64, this is x86_64" */
};
/* Reads path's ELF header before any dlopen. */
enum elf_verdict loom_elf_inspect(const char *path, char *why, size_t cap);
/* "aarch64" for EM_AARCH64; NULL for a machine without a name here. */
const char *loom_elf_machine_name(unsigned machine);
#endif /* LOOM_PLUGIN_MAPCHECK_H */
