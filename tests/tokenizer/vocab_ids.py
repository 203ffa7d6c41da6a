#!/usr/bin/env python3
"""Independent lookup of token ids with the gguf Python package.

usage: vocab_ids.py MODEL.gguf TEXT...
Prints one line per TEXT: the index of the first entry of
tokenizer.ggml.tokens equal to TEXT and its tokenizer.ggml.token_type,
or "-1 -1" when absent. The C test uses this so that the expected ids of
special tokens do not come from the tokenizer under test.
"""
import sys

import gguf


def field_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]


def field_ints(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    return [int(f.parts[i][0]) for i in f.data]


def main():
    reader = gguf.GGUFReader(sys.argv[1])
    tokens = field_strings(reader, "tokenizer.ggml.tokens")
    types = field_ints(reader, "tokenizer.ggml.token_type")
    for text in sys.argv[2:]:
        try:
            i = tokens.index(text)
        except ValueError:
            print(-1, -1)
            continue
        print(i, types[i] if types else 1)


if __name__ == "__main__":
    main()
