/* info.c: in progress */
