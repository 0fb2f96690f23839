/* jinja.h - the subset of Jinja2 that Hugging Face chat templates use, rendered as transformers renders them
 * (trim_blocks and lstrip_blocks on, loop controls on):
 *   text, {{ expr }}, {# comments #}, whitespace control ({%- -%} {{- -}}), {% if / elif / else / endif %},
 *   {% for x in xs %} / {% for k, v in d.items() %} with loop.index, index0, first, last, length, revindex,
 *   previtem, nextitem, an {% else %} and a filter (`for m in ms if m.role != 'system'`), {% break %},
 *   {% continue %}, {% set x = e %}, {% set ns.x = e %} on namespace(), {% macro %} with defaults and {{ caller }}-less
 *   calls, {% raw %}; expressions: none/true/false (any case), numbers, strings with escapes, lists, dicts,
 *   names, a.b, a['b'], a[i], slices a[i:j:k], calls, unary not and -, * / // % + - ~, comparisons, in,
 *   not in, and, or, x if c else y, `is [not]` tests (defined, undefined, none, string, number, integer,
 *   mapping, iterable, sequence, boolean, true, false, even, odd, equalto, eq, ne), filters (trim, length,
 *   count, upper, lower, title, capitalize, default/d, first, last, join, replace, list, string, int, float,
 *   abs, tojson, items, keys, values, reverse, sort, unique, select/reject, selectattr/rejectattr, map(attribute=),
 *   indent, safe, e/escape, wordcount, center) and the string and dict methods templates call (strip, lstrip,
 *   rstrip, split, startswith, endswith, upper, lower, title, capitalize, replace, format, items, keys,
 *   values, get); globals raise_exception(msg), namespace(...), range(...), strftime_now(fmt).
 * Anything else is an error naming it and its line: a template outside the subset is refused, never
 * rendered wrong. Values are cJSON trees (the context: messages, add_generation_prompt, bos_token, ...). */
#ifndef SEPAL_JINJA_H
#define SEPAL_JINJA_H

#include <cJSON.h>

#include "status.h"

/* Renders template src with the variables of ctx (a cJSON object) into *out (malloc'd). Errors:
 * "chat template line 3: unknown filter 'foo'", "chat template: raise_exception: Conversation roles must
 * alternate ..." (the template's own). */
sp_status sp_jinja_render(const char *src, const cJSON *ctx, char **out, sp_err *err);

#endif
