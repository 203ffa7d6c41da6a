/* Compiled by meson to ask hipcc whether it can target an architecture. */
#include <hip/hip_runtime.h>

__global__ void probe(int *p)
{
	*p = 1;
}
