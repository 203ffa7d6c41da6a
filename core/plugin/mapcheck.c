/* Where a plugin's pointers point (see mapcheck.h). The loaded objects'
 * segments come from the program headers the dynamic linker keeps
 * (dl_iterate_phdr), so no pointer a plugin hands over is read before it
 * is known to lie inside a mapped, readable segment. */
#include "plugin/mapcheck.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A range [addr, addr + len) and the segment flags it needs; base and
 * name pick one object (name NULL: any object). */
struct seg_query {
	uintptr_t addr;
	size_t len;
	uint32_t flags;
	ElfW(Addr) base;
	const char *name;
	bool found;
};

static bool seg_holds(const struct dl_phdr_info *info, const ElfW(Phdr) *ph,
		      const struct seg_query *q)
{
	uintptr_t start = info->dlpi_addr + ph->p_vaddr;
	uintptr_t end = start + ph->p_memsz;

	if (ph->p_type != PT_LOAD || (ph->p_flags & q->flags) != q->flags)
		return false;
	return q->addr >= start && q->addr < end && q->len <= end - q->addr;
}

static int seg_visit(struct dl_phdr_info *info, size_t size, void *data)
{
	struct seg_query *q = data;

	(void)size;
	if (q->name && (info->dlpi_addr != q->base || !info->dlpi_name ||
			strcmp(info->dlpi_name, q->name) != 0))
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		if (seg_holds(info, &info->dlpi_phdr[i], q)) {
			q->found = true;
			return 1;
		}
	}
	return 0;
}

static bool in_segments(struct seg_query *q)
{
	if (!q->addr || q->len > UINTPTR_MAX - q->addr)
		return false;
	dl_iterate_phdr(seg_visit, q);
	return q->found;
}

bool loom_map_in_object(void *dl, const void *p, size_t len, bool exec)
{
	struct link_map *lm = NULL;
	struct seg_query q = { .addr = (uintptr_t)p, .len = len,
			       .flags = exec ? PF_R | PF_X : PF_R };

	if (!dl)
		return in_segments(&q);
	if (dlinfo(dl, RTLD_DI_LINKMAP, &lm) || !lm || !lm->l_name)
		return false;
	q.base = lm->l_addr;
	q.name = lm->l_name;
	return in_segments(&q);
}

bool loom_map_readable(const void *p, size_t len)
{
	return loom_map_in_object(NULL, p, len, false);
}

bool loom_map_code(const void *fn)
{
	return loom_map_in_object(NULL, fn, 1, true);
}

bool loom_map_string_in(void *dl, const char *s, size_t max)
{
	for (size_t i = 0; i < max; i++) {
		if (!loom_map_in_object(dl, s + i, 1, false))
			return false;
		if (!s[i])
			return true;
	}
	return false;
}

bool loom_map_string(const char *s, size_t max)
{
	return loom_map_string_in(NULL, s, max);
}

bool loom_map_is_function(const void *sym)
{
	Dl_info info;
	const ElfW(Sym) *es = NULL;
	unsigned type;

	if (!loom_map_code(sym))
		return false;
	/* the symbol at exactly this address, when the dynamic table has one
	 * (an ifunc resolves to an implementation that may be local) */
	if (!dladdr1(sym, &info, (void **)&es, RTLD_DL_SYMENT) || !es || info.dli_saddr != sym)
		return true;
	type = ELF64_ST_TYPE(es->st_info);
	return type == STT_FUNC || type == STT_GNU_IFUNC;
}

/* ---- ELF header ---- */

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#elif defined(__i386__)
#define HOST_MACHINE EM_386
#elif defined(__arm__)
#define HOST_MACHINE EM_ARM
#elif defined(__riscv)
#define HOST_MACHINE EM_RISCV
#elif defined(__powerpc64__)
#define HOST_MACHINE EM_PPC64
#elif defined(__s390x__)
#define HOST_MACHINE EM_S390
#endif

const char *loom_elf_machine_name(unsigned machine)
{
	switch (machine) {
	case EM_X86_64: return "x86_64";
	case EM_AARCH64: return "aarch64";
	case EM_386: return "i386";
	case EM_ARM: return "arm";
	case EM_RISCV: return "riscv";
	case EM_PPC64: return "ppc64";
	case EM_PPC: return "ppc";
	case EM_S390: return "s390";
	case EM_MIPS: return "mips";
	case EM_LOONGARCH: return "loongarch";
	default: return NULL;
	}
}

static unsigned host_machine(void)
{
#ifdef HOST_MACHINE
	return HOST_MACHINE;
#else
	return 0;
#endif
}

static unsigned read16(const unsigned char *b, bool msb)
{
	return msb ? (unsigned)b[0] << 8 | b[1] : (unsigned)b[1] << 8 | b[0];
}

static bool host_msb(void)
{
	const uint16_t one = 1;

	return *(const unsigned char *)&one == 0;
}

static void machine_text(unsigned m, char *buf, size_t cap)
{
	const char *name = loom_elf_machine_name(m);

	if (name)
		snprintf(buf, cap, "%s", name);
	else
		snprintf(buf, cap, "ELF machine %u", m);
}

/* e_ident, then e_type and e_machine: the same offsets in both classes. */
enum elf_verdict loom_elf_inspect(const char *path, char *why, size_t cap)
{
	unsigned char h[EI_NIDENT + 4];
	char theirs[32], ours[32];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	bool msb;
	ssize_t n;

	if (fd < 0)
		return ELF_UNREADABLE;
	n = read(fd, h, sizeof(h));
	close(fd);
	if (n != (ssize_t)sizeof(h) || memcmp(h, ELFMAG, SELFMAG) != 0 ||
	    (h[EI_DATA] != ELFDATA2LSB && h[EI_DATA] != ELFDATA2MSB))
		return ELF_NOT_SHARED;
	msb = h[EI_DATA] == ELFDATA2MSB;
	if (read16(h + EI_NIDENT, msb) != ET_DYN)
		return ELF_NOT_SHARED;
	machine_text(read16(h + EI_NIDENT + 2, msb), theirs, sizeof(theirs));
	machine_text(host_machine(), ours, sizeof(ours));
	if (host_machine() && read16(h + EI_NIDENT + 2, msb) != host_machine()) {
		snprintf(why, cap, "built for %s, this is %s", theirs, ours);
		return ELF_FOREIGN;
	}
	if (h[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) ||
	    msb != host_msb()) {
		snprintf(why, cap, "a %s-bit %s-endian %s object, this is a %zu-bit %s-endian %s",
			 h[EI_CLASS] == ELFCLASS64 ? "64" : "32", msb ? "big" : "little", theirs,
			 sizeof(void *) * 8, host_msb() ? "big" : "little", ours);
		return ELF_FOREIGN;
	}
	return ELF_OK;
}
