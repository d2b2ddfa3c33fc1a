"""Jinja2 templates of generated WGSL: the code a shader receives through its `{{NAME}}` defines
(kvviz.gpu.shaders) when it is unrolled per query head, token and vec4, written as a template under shaders/
(`family/name.wgsl.j2`) instead of Python string building.

A template fills a shader's defines with top-level upper-case block sets,

    {% set STEP %}
    {% for u in range(U) %}
    let tt{{u}} = tb + rg * U + {{u}}u;
    {% endfor %}
    {% endset %}

and `render_defines(path, **context)` returns them ({"STEP": "...", ...}) rendered with the values the Python
picks (sizes, flags, the format): the caller passes them on as defines, beside its plain values. Templates use
Jinja's own means to share code: `{% import %}` of macro files, `{% extends %}` of a kernel skeleton whose
`{% block %}`s a format overrides. Blocks and tags on lines of their own leave no blank line (trim_blocks,
lstrip_blocks); blank lines and trailing spaces are dropped from every define, so a template may lay its tags
out for reading. An undefined name is an error (StrictUndefined), not an empty string in a kernel.
"""
from __future__ import annotations

from functools import lru_cache

import jinja2

from kvviz.gpu.shaders import SHADER_DIR


@lru_cache(maxsize=1)
def environment():
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(SHADER_DIR)), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, autoescape=False)


def tidy(text: str) -> str:
    """The lines of `text` without trailing spaces, blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.splitlines() if line.strip())


def render_defines(path: str, **context) -> dict[str, str]:
    """The defines template `path` (relative to shaders/) fills: each top-level upper-case `{% set %}` it (or a
    template it extends) makes, rendered with `context`, tidied. A render is a function of the template and its
    values, so it is kept (_rendered) for the next plan of the same kernel: a decode plans its kernel every step,
    and a render of the larger kernels takes milliseconds."""
    values = tuple(sorted((k, _frozen(v)) for k, v in context.items()))
    try:
        hash(values)
    except TypeError:  # a value that cannot be a key: rendered every time
        return dict(_render(path, values))
    return dict(_rendered(path, values))


def _frozen(v):
    return tuple(_frozen(x) for x in v) if isinstance(v, (list, tuple)) else v


def _render(path: str, values: tuple) -> tuple:
    module = environment().get_template(path).make_module(dict(values))
    return tuple((name, tidy(str(value))) for name, value in vars(module).items() if name.isupper())


_rendered = lru_cache(maxsize=64)(_render)
