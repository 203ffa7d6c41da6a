/* Configure-time probe: does clang link a libFuzzer target? */
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return 0;
}
