/* gguf.c: in progress */
