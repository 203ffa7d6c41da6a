/* Collectives over MPI for host-memory backends (ref.so, cpu.so): the
 * generation-1.4 `collective` slot on buffers the host can read. Built
 * into each backend that uses it (backends never share a library). */
#ifndef LOOM_BACKEND_MPI_COLL_H
#define LOOM_BACKEND_MPI_COLL_H

#include "loom/backend.h"

/* Runs a->op on host memory. LOOM_ERR_UNSUPPORTED when built without MPI,
 * LOOM_ERR_INVALID for inconsistent arguments, LOOM_ERR_NOMEM, or
 * LOOM_ERR_IO when MPI fails. `why` (may be NULL) gets a reason. */
int loom_mpi_collective(const struct loom_collective_args *a, char *why, size_t len);

#endif
