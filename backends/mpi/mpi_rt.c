/* MPI for the backends, found at run time (see mpi_rt.h). */
#if LOOM_HAVE_MPI
#include "mpi_rt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>

static struct loom_mpi_rt rt;
static bool rt_ok;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

#define FIND(field, name) (rt.field = (__typeof__(rt.field))dlsym(RTLD_DEFAULT, name))

static void rt_bind(void)
{
	rt_ok = FIND(allgatherv, "MPI_Allgatherv") && FIND(alltoallv, "MPI_Alltoallv") &&
		FIND(bcast, "MPI_Bcast") && FIND(comm_size, "MPI_Comm_size") &&
		FIND(comm_rank, "MPI_Comm_rank");
#ifdef OPEN_MPI
	/* Open MPI's predefined types are the addresses of objects of libmpi */
	rt.flt = (MPI_Datatype)dlsym(RTLD_DEFAULT, "ompi_mpi_float");
	rt.byte = (MPI_Datatype)dlsym(RTLD_DEFAULT, "ompi_mpi_byte");
	rt_ok = rt_ok && rt.flt && rt.byte;
#else
	rt.flt = MPI_FLOAT; /* constants in MPICH's ABI */
	rt.byte = MPI_BYTE;
#endif
}

const struct loom_mpi_rt *loom_mpi_rt(void)
{
	pthread_once(&rt_once, rt_bind);
	return rt_ok ? &rt : NULL;
}
#endif
