/* backend_loader.c: in progress */
