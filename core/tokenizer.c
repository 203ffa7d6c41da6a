/* tokenizer.c: in progress */
