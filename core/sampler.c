/* sampler.c: in progress */
