#!/usr/bin/env python3
"""The grammar engine against an independent JSON validator.

For each schema: instances that Python's jsonschema accepts, written the
ways a model writes JSON (compact, spaced, indented), must be complete
sentences of the compiled grammar; instances it refuses, and malformed
JSON, must not be; and every text the grammar accepts must parse with
json.loads and validate. Unsupported schemas must fail naming what is
unsupported. With SmolLM2's and Gemma's vocabularies (when cached), random
walks over the masked vocabulary must produce valid documents, and the
first masks of each walk must agree with pushing every token alone.
Random token trees pruned by the matcher (speculative verification) keep
exactly the nodes whose own path is allowed, each row masked after it.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import jsonschema

TOOL = sys.argv[1]
fails = []


def check(kind, spec, texts):
    with tempfile.NamedTemporaryFile('w', suffix='.json', delete=False) as f:
        f.write(json.dumps(spec) if spec is not None else '')
        path = f.name
    try:
        p = subprocess.run([TOOL, 'check', kind, path if spec is not None else '-'],
                           input=''.join(json.dumps(t) + '\n' for t in texts),
                           capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        return p.stdout.strip() or p.stderr.strip()
    return p.stdout.split()


def forms(inst):
    """The ways a model may write inst (property order kept; names and
    enum strings as JSON writes them, UTF-8 as is: the grammar offers
    those one spelling, any spelling inside free strings)."""
    return [json.dumps(inst, separators=(',', ':'), ensure_ascii=False),
            json.dumps(inst, ensure_ascii=False),
            json.dumps(inst, indent=2, ensure_ascii=False),
            json.dumps(inst, indent='\t', ensure_ascii=False),
            ' ' + json.dumps(inst, ensure_ascii=False) + '\n']


def other_forms(inst):
    """Spellings the grammar may refuse (\\u escapes everywhere)."""
    return [json.dumps(inst), json.dumps(inst, indent=1)]


def expect(name, ok, msg):
    if not ok:
        fails.append(f'{name}: {msg}')


SCHEMAS = [
    ('object', {
        'type': 'object',
        'properties': {'name': {'type': 'string'}, 'age': {'type': 'integer'},
                       'tags': {'type': 'array', 'items': {'type': 'string'}, 'maxItems': 3},
                       'ok': {'type': 'boolean'}},
        'required': ['name', 'age'], 'additionalProperties': False},
     [{'name': 'bob', 'age': 3}, {'name': 'é ü 中文 \n\t"q"\\', 'age': -120},
      {'name': '', 'age': 0, 'tags': [], 'ok': False},
      {'name': 'x', 'age': 7, 'tags': ['a', 'b', 'c'], 'ok': True},
      {'name': 'x', 'age': 1, 'ok': True}],
     [{'age': 3}, {'name': 'bob'}, {'name': 'x', 'age': 1.5}, {'name': 3, 'age': 1},
      {'name': 'x', 'age': 1, 'tags': ['a', 'b', 'c', 'd']}, {'name': 'x', 'age': 1, 'zz': 1},
      {'name': 'x', 'age': 1, 'tags': [1]}, [], 'x', None]),
    ('enum-const', {
        'type': 'object',
        'properties': {'color': {'enum': ['red', 'green', 3, None]}, 'v': {'const': 'x'},
                       'n': {'type': 'number'}},
        'required': ['color', 'v', 'n']},
     [{'color': 'red', 'v': 'x', 'n': 1.5}, {'color': 3, 'v': 'x', 'n': -0.25e-3},
      {'color': None, 'v': 'x', 'n': 12}],
     [{'color': 'blue', 'v': 'x', 'n': 1}, {'color': 'red', 'v': 'y', 'n': 1},
      {'color': 'red', 'v': 'x', 'n': '1'}, {'color': 'red', 'v': 'x'}]),
    ('recursive-anyOf', {
        'type': 'object',
        'properties': {'id': {'anyOf': [{'type': 'integer'}, {'type': 'string'}]},
                       'child': {'anyOf': [{'$ref': '#'}, {'type': 'null'}]}},
        'required': ['id', 'child'], 'additionalProperties': False},
     [{'id': 1, 'child': None}, {'id': 'a', 'child': {'id': 2, 'child': {'id': 'b', 'child': None}}}],
     [{'id': 1.5, 'child': None}, {'id': 1}, {'id': 1, 'child': {'id': 2}},
      {'id': 1, 'child': 3}]),
    ('array-bounds', {'type': 'array', 'items': {'type': 'number'}, 'minItems': 2, 'maxItems': 4},
     [[1, 2], [1.5, -2, 3e5], [0, 0, 0, 0]],
     [[], [1], [1, 2, 3, 4, 5], [1, 'a'], {'a': 1}]),
    ('type-list', {'type': ['string', 'null']},
     ['abc', None, ''], [1, True, [], {}]),
    ('map', {'type': 'object', 'additionalProperties': {'type': 'integer'}},
     [{}, {'a': 1, 'b': -2}], [{'a': 'x'}, {'a': 1.5}, [1]]),
    ('defs', {'$defs': {'P': {'type': 'object', 'properties': {'x': {'type': 'number'}},
                              'required': ['x']}},
              'type': 'array', 'items': {'$ref': '#/$defs/P'}},
     [[], [{'x': 1}, {'x': 2.5}]], [[{}], [{'x': 'a'}], {'x': 1}]),
    ('oneOf', {'oneOf': [{'type': 'boolean'}, {'type': 'object', 'properties': {'k': {'const': 1}},
                                               'required': ['k']}]},
     [True, False, {'k': 1}], [{'k': 2}, 1, 'true']),
    ('any', True, [1, 'a', None, {'a': [1, {'b': None}]}, [True, 1.25]], []),
]

MALFORMED = ['', '{', '{"name": "bob", "age": 3,}', '{"name": "bob" "age": 3}',
             "{'name': 'bob', 'age': 3}", '{"name": "bob", "age": 03}',
             '{"name": "b\x01", "age": 3}', '{"name": "bob", "age": 3}}',
             '{"name": "\\x", "age": 3}', '[1, 2,]', 'nul', 'truee', '01', '-', '1.', '1e',
             '{"a": 1}\n\n\n', '{' + '\n' + ' ' * 25 + '"a": 1}']

for name, schema, good, bad in SCHEMAS:
    for inst in good:
        jsonschema.validate(inst, schema)  # the fixture itself is right
        texts = forms(inst)
        out = check('json_schema', schema, texts)
        for t, r in zip(texts, out):
            expect(name, r == '1', f'valid {t!r} not accepted ({r})')
        # every proper prefix is a prefix, not a sentence or refused
        t = texts[0]
        out = check('json_schema', schema, [t[:i] for i in range(len(t))])
        expect(name, all(r == 'p' for r in out) or isinstance(out, str),
               f'prefixes of {t!r}: {out}')
    for inst in bad:
        expect(name, not jsonschema.Draft202012Validator(schema).is_valid(inst),
               f'fixture {inst!r} is valid')
        texts = forms(inst)
        out = check('json_schema', schema, texts)
        for t, r in zip(texts, out):
            expect(name, r != '1', f'invalid {t!r} accepted')
    # soundness over everything tried: accepted => parses and validates
    texts = MALFORMED + [f for inst in good + bad for f in forms(inst) + other_forms(inst)]
    out = check('json_schema', schema, texts)
    for t, r in zip(texts, out):
        if r != '1':
            continue
        try:
            inst = json.loads(t)
            ok = jsonschema.Draft202012Validator(schema).is_valid(inst)
        except ValueError:
            ok = False
        expect(name, ok, f'accepted {t!r} does not parse and validate')

# json_object: any object, nothing else
texts = ['{}', '{"a": [1, {"b": null}], "c": "d"}', '[]', '1', '"s"', '{"a" 1}']
out = check('json_object', None, texts)
expect('json_object', out == ['1', '1', '0', '0', '0', '0'], f'{out}')

# tool calls: required and auto
tools = {'tools': [{'name': 'get_weather', 'parameters': {
    'type': 'object', 'properties': {'city': {'type': 'string'}}, 'required': ['city']}},
    {'name': 'noop'}], 'mode': 'required', 'begin': '<tool_call>', 'end': '</tool_call>',
    'max_calls': 2}
call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
texts = [call, call + '\n' + '<tool_call>{"name":"noop","arguments":{}}</tool_call>',
         '<tool_call>{"name": "other", "arguments": {}}</tool_call>',
         '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>', 'Hello']
out = check('tool_calls', tools, texts + [call + call + call])
expect('tools-required', out == ['1', '1', '0', '0', '0', '0'], f'{out}')
tools['max_calls'] = 1
out = check('tool_calls', tools, texts)
expect('tools-one', out == ['1', '0', '0', '0', '0'], f'{out}')
tools['max_calls'] = 2
tools['mode'] = 'auto'
out = check('tool_calls', tools, texts + ['<tool_callx', '<tool', ' <tool_call>'])
# text that only starts like the marker is text
expect('tools-auto', out == ['1', '1', '0', '0', '1', '1', '1', '1'], f'{out}')

# Llama 3.x: one bare {"name", "parameters"} object; "auto": or text not
# starting with "{"
llama = {'tools': tools['tools'], 'mode': 'required', 'args_key': 'parameters'}
lcall = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
ltexts = [lcall, ' ' + lcall + '\n', '{"name": "get_weather", "arguments": {"city": "P"}}',
          lcall + lcall, 'Hello', '{"name": "noop", "parameters": {}}']
out = check('tool_calls', llama, ltexts)
expect('tools-llama3-required', out == ['1', '1', '0', '0', '0', '1'], f'{out}')
llama['mode'] = 'auto'
out = check('tool_calls', llama, ltexts + ['{not a call', 'a {b}'])
expect('tools-llama3-auto', out == ['1', '1', '0', '0', '1', '1', '0', '1'], f'{out}')
# Mistral: [TOOL_CALLS] then the calls as one JSON array
mistral = {'tools': tools['tools'], 'mode': 'required', 'begin': '[TOOL_CALLS]', 'list': True,
           'max_calls': 2}
mcall = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
mtexts = ['[TOOL_CALLS][' + mcall + ']', '[TOOL_CALLS] [' + mcall + ', {"name": "noop", '
          '"arguments": {}}]', '[TOOL_CALLS][' + ', '.join([mcall] * 3) + ']',
          '[TOOL_CALLS]' + mcall, '[TOOL_CALLS][]', 'Hi']
out = check('tool_calls', mistral, mtexts)
expect('tools-mistral-required', out == ['1', '1', '0', '0', '0', '0'], f'{out}')
mistral['mode'] = 'auto'
# a proper prefix of the marker is text, as for <tool_call>
out = check('tool_calls', mistral, mtexts + ['[TOOL_CALL', '[TOOL_CALLS'])
expect('tools-mistral-auto', out == ['1', '1', '0', '0', '0', '1', '1', '1'], f'{out}')
# gpt-oss's harmony: <|channel|>commentary to=functions.NAME
# <|constrain|>json<|message|>ARGS<|call|>, one call
harmony = {'tools': tools['tools'], 'mode': 'required', 'args_key': 'harmony',
           'begin': '<|channel|>commentary ', 'end': '<|call|>', 'max_calls': 1}
hcall = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
         '{"city": "Paris"}<|call|>')
htexts = [hcall, '<|channel|>commentary to=functions.noop <|constrain|>json<|message|>{}<|call|>',
          hcall.replace('get_weather', 'other'), hcall.replace('{"city": "Paris"}', '{}'),
          hcall + hcall, 'Hello', '<|channel|>final<|message|>Hi']
out = check('tool_calls', harmony, htexts)
expect('tools-harmony-required', out == ['1', '1', '0', '0', '0', '0', '0'], f'{out}')
harmony['mode'] = 'auto'
out = check('tool_calls', harmony, htexts)
expect('tools-harmony-auto', out == ['1', '1', '0', '0', '0', '1', '1'], f'{out}')
out = check('tool_calls', dict(mistral, args_key='args'), ['x'])
expect('tools-args-key-checked', isinstance(out, str) and 'args_key' in out, f'{out}')

# unsupported schemas: refused naming what
for schema, word in [({'type': 'string', 'pattern': 'a+'}, 'pattern'),
                     ({'type': 'integer', 'minimum': 0}, 'minimum'),
                     ({'allOf': [{'type': 'string'}]}, 'allOf'),
                     ({'type': 'date'}, 'date'),
                     ({'$ref': '#/$defs/missing'}, 'missing'),
                     ({'type': 'object', 'required': ['a']}, "'a'"),
                     ({'anyOf': [{'type': 'string'}], 'type': 'string'}, 'anyOf'),
                     ({'$defs': {'a': {'$ref': '#/$defs/a'}}, '$ref': '#/$defs/a'},
                      'nothing can match'),
                     ({'type': 'array', 'minItems': 3, 'maxItems': 2}, 'minItems'),
                     ({'type': 'array', 'maxItems': 100000}, 'maxItems'),
                     # more alternatives at once than the matcher keeps: said
                     # so, not "nothing can match"
                     ({'enum': [f'v{i}' for i in range(600)]}, 'too many alternatives'),
                     ({'anyOf': [{'const': i} for i in range(600)]}, 'too many alternatives'),
                     (False, 'false')]:
    out = check('json_schema', schema, ['"x"'])
    expect('unsupported', isinstance(out, str) and out.startswith('error:') and word in out,
           f'{schema}: {out}')

# the same below the top level: refused when it compiles, naming the
# limit (it used to compile and keep only the first 512 values)
for schema in [{'type': 'object', 'properties': {'a': {'enum': [f'v{i:03}' for i in range(600)]}},
                'required': ['a']},
               {'type': 'array', 'items': {'anyOf': [{'const': i} for i in range(513)]}}]:
    out = check('json_schema', schema, ['{"a":"v599"}'])
    expect('nested-large', isinstance(out, str) and 'too many alternatives' in out and
           'at most 512' in out, f'{out}')

# nested alternatives whose product is over the limit (30 anyOf branches
# of 30 values each, open together where the value starts): the matcher
# says it overflowed on every text that gets there, never a truncated
# answer; the text before is still followed
wide = {'type': 'object', 'required': ['a'], 'properties': {'a': {'anyOf': [
    {'enum': [f'x{j}_{i}' for i in range(30)]} for j in range(30)]}}}
out = check('json_schema', wide, ['{"a":"x29_29"}', '{"a":"x0_0"}', '{"a":', '{"b":'])
expect('product-overflow', out == ['overflow', 'overflow', 'overflow', '0'], f'{out}')

# a large enum below the limit still matches its last value exactly
out = check('json_schema', {'enum': [f'v{i}' for i in range(400)]}, ['"v399"', '"v400"', '"v3"'])
expect('enum-400', out == ['1', '0', '1'], f'{out}')

# random schemas: instances generated from the schema (properties in
# schema order) must be accepted; mutated texts accepted only if valid
rng = random.Random(1234)


def rand_schema(depth=0):
    kinds = ['string', 'integer', 'number', 'boolean', 'null', 'enum']
    if depth < 3:
        kinds += ['object', 'object', 'array', 'anyOf']
    k = rng.choice(kinds)
    if k == 'enum':
        return {'enum': rng.sample(['a', 'b c', 1, 2.5, None, True, '\u00e9'], rng.randint(1, 4))}
    if k == 'object':
        names = rng.sample(['id', 'name', 'x', 'y', 'tags', 'k"q'], rng.randint(0, 4))
        props = {n: rand_schema(depth + 1) for n in names}
        return {'type': 'object', 'properties': props,
                'required': [n for n in names if rng.random() < 0.6],
                'additionalProperties': False}
    if k == 'array':
        lo = rng.randint(0, 2)
        return {'type': 'array', 'items': rand_schema(depth + 1), 'minItems': lo,
                'maxItems': lo + rng.randint(0, 3)}
    if k == 'anyOf':
        return {'anyOf': [rand_schema(depth + 1) for _ in range(rng.randint(1, 3))]}
    return {'type': k}


def rand_instance(s):
    if 'enum' in s:
        return rng.choice(s['enum'])
    if 'anyOf' in s:
        return rand_instance(rng.choice(s['anyOf']))
    t = s['type']
    if t == 'object':
        return {n: rand_instance(v) for n, v in s['properties'].items()
                if n in s['required'] or rng.random() < 0.5}
    if t == 'array':
        return [rand_instance(s['items']) for _ in range(rng.randint(s['minItems'], s['maxItems']))]
    return {'string': lambda: rng.choice(['', 'abc', 'a\nb', '\u4e2d\u6587', 'q"\\']),
            'integer': lambda: rng.randint(-1000, 1000),
            'number': lambda: rng.choice([0, -1.5, 3.25e-5, 12]),
            'boolean': lambda: rng.random() < 0.5, 'null': lambda: None}[t]()


def mutate(text):
    i = rng.randrange(len(text) + 1)
    op = rng.randrange(3)
    if op == 0:
        return text[:i] + rng.choice('{}[],:" 0a-.en') + text[i:]
    if op == 1 and i < len(text):
        return text[:i] + text[i + 1:]
    return text[:i]


n_fuzz = 0
for _ in range(60):
    schema = rand_schema()
    valid = [rand_instance(schema) for _ in range(4)]
    texts = [f for inst in valid for f in forms(inst)]
    out = check('json_schema', schema, texts)
    if isinstance(out, str):
        expect('random', False, f'{schema}: {out}')
        continue
    for t, r in zip(texts, out):
        expect('random', r == '1', f'{schema}: valid {t!r} not accepted ({r})')
    muts = [mutate(t) for t in texts for _ in range(3)]
    muts += [f for inst in valid for f in other_forms(inst)]
    out = check('json_schema', schema, muts)
    for t, r in zip(muts, out):
        if r == '1':
            try:
                ok = jsonschema.Draft202012Validator(schema).is_valid(json.loads(t))
            except ValueError:
                ok = False
            expect('random', ok, f'{schema}: accepted {t!r} is not valid')
    n_fuzz += len(texts) + len(muts)
print(f'random schemas: {n_fuzz} texts checked')

def schema_file(schema):
    """schema written to a temporary file (the caller removes it)."""
    with tempfile.NamedTemporaryFile('w', suffix='.json', delete=False) as f:
        json.dump(schema, f)
        return f.name


# random walks over real vocabularies
cache = os.path.expanduser('~/.cache/loom')
models = [os.environ.get('LOOM_MODEL', ''), os.path.join(cache, 'gemma-3-270m-q4_k_m.gguf')]
walked = 0
for gguf in models:
    if not os.path.exists(gguf):
        print(f'walks: {gguf or "LOOM_MODEL"} missing, skipped')
        continue
    for name, schema, _, _ in SCHEMAS[:4]:
        path = schema_file(schema)
        n = 4 if 'gemma' in gguf else 8
        p = subprocess.run([TOOL, 'walk', gguf, 'json_schema', path, '7', str(n), '300'],
                           capture_output=True, text=True, timeout=120)
        os.unlink(path)
        expect(f'walk {name}', p.returncode == 0, p.stderr.strip())
        lines = p.stdout.splitlines()
        expect(f'walk {name}', len(lines) >= n // 2, f'only {len(lines)} of {n} walks finished')
        for line in lines:
            text = json.loads(line)
            try:
                ok = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
            except ValueError:
                ok = False
            expect(f'walk {name}', ok, f'{os.path.basename(gguf)}: {text!r} is not valid')
            walked += 1
print(f'{walked} random walks validated')

# token trees (speculative verification): loom_gmatch_tree keeps exactly
# the nodes whose path pushing token by token allows, a refused node's
# subtree goes, and each kept row's mask is the mask after its own path
for gguf in models[:1]:
    if not os.path.exists(gguf):
        print(f'trees: {gguf or "LOOM_MODEL"} missing, skipped')
        continue
    for name, schema, _, _ in SCHEMAS[:4]:
        path = schema_file(schema)
        p = subprocess.run([TOOL, 'tree', gguf, 'json_schema', path, '11', '120'],
                           capture_output=True, text=True, timeout=120)
        os.unlink(path)
        expect(f'tree {name}', p.returncode == 0, p.stderr.strip())
        print(f'tree {name}: {p.stdout.strip()}')

for f in fails:
    print('FAIL', f)
print('grammar:', 'FAIL' if fails else 'ok')
sys.exit(1 if fails else 0)
