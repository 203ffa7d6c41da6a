/* MPI for the backends, found at run time.
 *
 * A backend does not link libmpi: single-host runs load it too, and must
 * not pull MPI in (a package of loom then needs no MPI). The few MPI
 * functions the collective slots call are looked up in the process's
 * global scope at their first call, where the host's MPI module put
 * libmpi (core/dist/dist_load.c) before any job could reach a collective;
 * a program that links libmpi itself (tests/dist) has it there from the
 * start. Built into each backend that needs it (backends share no
 * library), with hidden symbols.
 */
#ifndef LOOM_BACKEND_MPI_RT_H
#define LOOM_BACKEND_MPI_RT_H

#include <mpi.h>

struct loom_mpi_rt {
	__typeof__(MPI_Allgatherv) *allgatherv;
	__typeof__(MPI_Alltoallv) *alltoallv;
	__typeof__(MPI_Bcast) *bcast;
	__typeof__(MPI_Comm_size) *comm_size;
	__typeof__(MPI_Comm_rank) *comm_rank;
	MPI_Datatype flt, byte; /* MPI_FLOAT, MPI_BYTE */
};

/* Every function and type found, or NULL when MPI is not in the process. */
const struct loom_mpi_rt *loom_mpi_rt(void);

#endif
