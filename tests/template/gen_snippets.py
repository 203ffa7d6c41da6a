#!/usr/bin/env python3
"""Writes jinja2_snippets.json: small templates and what jinja2 renders for
them, configured as transformers configures it (the oracle for
test_jinja.c; needs jinja2, which the test itself does not).

  python3 tests/template/gen_snippets.py > tests/template/jinja2_snippets.json
"""
import json
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
import datetime
def raise_exception(m): raise Exception(m)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env=ImmutableSandboxedEnvironment(trim_blocks=True,lstrip_blocks=True,extensions=[loopcontrols])
env.filters['tojson']=tojson
env.globals['raise_exception']=raise_exception
ctx={"x": "X", "messages":[{"role":"user","content":"Hé <b>"},{"role":"assistant","content":"ok"}],"n":3,"d":{"b":2,"a":[1,2.5,None,True]}}
cases=[
 "  {% if true %}\n  x\n  {% endif %}\nend\n",
 "a  {%- if true -%}  b  {%- endif -%}  c",
 "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ '|' if not loop.last }}{% endfor %}",
 "{% for m in messages if m.role == 'assistant' %}{{ loop.first }}{{ m.content }}{% else %}none{% endfor %}",
 "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
 "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d|tojson(sort_keys=true, separators=(',', ':')) }}",
 "{% set ns = namespace(x=0) %}{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}",
 "{% macro f(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}",
 "{{ 'a,b,,c'.split(',') }}{{ ' x y '.split() }}{{ 'abc'[::-1] }}{{ [1,2,3][1:] }}{{ 'Hé'|length }}",
 "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 10 / 5 }}",
 "{{ undefined_thing }}|{{ undefined_thing is defined }}|{{ undefined_thing | default('dflt') }}|{{ none }}|{{ [none, true, 'it''s'] }}",
 "{{ messages | map(attribute='role') | join(', ') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
 "{% set x %}  inner {{ n }}  {% endset %}[{{ x | trim }}]{% filter upper %}up{{ n }}{% endfilter %}",
 "{{ 'x' ~ 1 ~ none }}{{ 'abc' if n > 2 else 'def' }}{{ 'b' in 'abc' }}{{ 3 not in [1,2] }}",
 "{{ {'b':1,'a':2} | dictsort }}{{ [3,1,2] | sort | list }}{{ ['b','A','a'] | unique | list }}",

 "{{ '--x--'.strip('-') }}|{{ 'abc'.startswith(('x','a')) }}|{{ 'a-b-c'.rsplit('-', 1) }}|{{ 'aXbX'.replace('X', '.') }}|{{ 'hello'.find('l') }}|{{ ' a '.lstrip() }}.",
 "{% for i in [1,2,3] %}{{ loop.revindex }}{{ loop.previtem if loop.previtem is defined else '-' }}{% endfor %}",
 "{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}",
 "{{ 1 is number }}{{ 'a' is string }}{{ d is mapping }}{{ [] is iterable }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ none is none }}{{ n is integer }}",
 "{{ [1,2,3,4][-2:] }}{{ [1,2,3,4][::2] }}{{ 'héllo'[1:3] }}{{ 1 < n < 5 }}",
 "{{ d.get('zz', 'miss') }}{{ d['b'] }}{{ d.a[1] }}{{ 'say \\\"hi\\\" é\\n' | tojson }}{{ [\"it's\"] }}",
 "a\n  {#- comment #}\n  {{- ' b' }}\n{%+ if true %}c{% endif %}\n  {# c2 #}\nd",
 "{% if messages[0].role == 'user' %}U{% elif n %}N{% else %}E{% endif %}{% set a, b = 1, 2 %}{{ a + b }}",
 "{{ messages | length }}{{ messages | first | tojson }}{{ (messages | last).content }}{{ messages[0]['content'] | upper }}",
 "{% for x in [] %}x{% else %}empty{% endfor %}{% for i in range(3) %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}",
 "{{ 'a' + 'b' * 2 }}{{ [1] + [2] }}{{ -n }}{{ n * 1.5 }}{{ true + 1 }}{{ 'x' if none else 'y' }}{{ none or 'z' }}{{ 0 and 1 }}",
 '{{ "they\'re ok-go x1y a.b"|title }}|{{ "they\'re ok-go x1y a.b".title() }}|{{ "HÉ"|lower }}',
 "{{ 'é😀 x' | tojson(ensure_ascii=True) }}|{{ d | tojson(false, 1) }}|{{ messages[0].content | tojson(true) }}",
 "{{ (5 / 2) | round | int }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 3.14159 | round(2) }} {{ 2.7 | round(method='floor') }} {{ -1.5 | round }} {{ 7 | round }} {{ 7 | round(1, 'floor') }}",
 "{% for i in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}|{{ '%s=%d %r %%' % ('k', 3, 'v') }}|{{ 'x%s' % 1 }}|{{ '12'.isnumeric() }}",
 "{{ '  a b\\n\\nc \\n' | indent(2, blank=true) }}|{{ 'a\\r\\nb' | indent('> ', true) }}|{{ '  a b\\n c ' .split(None, 1) }}|{{ ' a b '.rsplit(None, 1) }}",
 "{% for item in [{'n': 'a', 'c': [{'n': 'b', 'c': [{'n': 'c'}]}, {'n': 'd'}]}, {'n': 'e'}] recursive %}[{{ loop.depth }}{{ loop.depth0 }}:{{ item.n }}{% if item.c %}({{ loop(item.c) }}){% endif %}]{% endfor %}",
 "{% macro w(x) %}<{{ caller(x, 2) }}>{% endmacro %}{% call(v, k=1) w('a') %}{{ v | upper }}{{ k }}{% endcall %}",
 "[{{ '\\u00a0 x\\u3000'.strip() }}][{{ '\\u3000a\\u2003b '.split() | join('|') }}][{{ 'èaè'.strip('è') }}][{{ '\\u00a0y\\u00a0' | trim }}]",
 "{{ ['\\u00a0x\\u3000', 'é\\u200b', '\\x85'] }}|{{ 'a\\u3000b c_d é'|wordcount }}|{{ 'x\\u3000y-z(w'|title }}",
 "{% for i in [1, 2] %}[{{ y }}]{% set y = i %}{% endfor %}{% macro m(a, b=a, c=x) %}{{ b }}{{ c }}{{ varargs }}{% endmacro %}{{ m(1) }}{{ m(1, 2, 3, 4) }}",
 "  {% raw %}\n  {{ y }}{% if %}\n  {% endraw %}\nz{% with a = n + 1, b = n %}{{ a }}{{ b }}{% endwith %}{{ a is defined }}",
 "{{ 'prefix_x'.removeprefix('prefix_') }}{{ 'a.txt'.removesuffix('.txt') }}{{ 'ab'.removeprefix('z') }}|{{ '%s-%s' | format(1, 'b') }}",
 "{{ '  text\nline2\n' | indent(2) }}|{{ 'hello world' | title }}|{{ 'ab' | center(6) }}|{{ 3.7 | int }}|{{ '42' | int + 1 }}",
]
out = {"context": ctx,
       "cases": [{"template": t, "expected": env.from_string(t).render(**ctx)} for t in cases]}
print(json.dumps(out, ensure_ascii=False, indent=1))
