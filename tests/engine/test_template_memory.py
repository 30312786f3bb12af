"""A chat template is bounded in memory as well as time: each hostile template
below asked for gigabytes (a 4 GB string, a 40-million-item list) or hundreds of
MiB, and now fails fast with an error naming the limit, having used little."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO

BIG = "y" * 5_000_000  # a long message raises the output limit to 40 million characters

CASES = {
    # a string doubled with ~ 40 times (4 GB at the 32nd), one step at a time
    "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}": ("~ concatenation", ""),
    # 40 million items from a long message (868 MB before)
    "{{ (messages[0].content * 8) | list | length }}": ("items", BIG),
    "{{ ('x' * 4000000) | batch(1) | list | length }}": ("items", ""),
    "{% set ns = namespace(l=[1]) %}{% for i in range(22) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|map('string')|list|length }}": ("items", ""),
    "{% set s = 'x' * 4000 %}{{ s.replace('x', s).replace('x', s) | length }}": ("str.replace", ""),
    "{% set s = 'x' * 4000000 %}{{ s.join(['a'] * 1000) | length }}": ("str.join", ""),
    "{{ '{:>999999999}'.format(1) | length }}": ("str.format", ""),
    "{{ ('%*d' % (999999999, 1)) | length }}": ("% formatting", ""),
    "{{ ('\\t' * 4000000).expandtabs(4000000) | length }}": ("str.expandtabs", ""),
    "{{ ('a\\n' * 2000000) | indent(4000000) | length }}": ("the filter indent", ""),
    "{{ ('x' * 1000) | wordwrap(1, true, 'x' * 4000000) | length }}": ("the filter wordwrap", ""),
    "{{ [[1] * 1000] * 1000 | sum(start=[]) | length }}": ("sum may only add numbers", ""),
    # many distinct strings, each within the size limits: the memory limit
    "{% set ns = namespace(a=[]) %}{% for i in range(60) %}{% set ns.a = ns.a + [('x' * 4000000) ~ i] %}{% endfor %}{{ ns.a|length }}": ("MiB of memory", ""),
}

_CHILD = """
import json, resource, sys, time, tracemalloc
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # this child only: a regression fails, not the machine
from localllm.engine.chat_template import ChatTemplate, TemplateError
cases = json.loads(sys.stdin.read())
tracemalloc.start()
for source, content in cases:
    tracemalloc.reset_peak()
    t0 = time.perf_counter()
    try:
        msgs = [{"role": "user", "content": content}]
        out = "rendered " + ChatTemplate(source, "t").render(msgs, bos_token="", eos_token="", add_generation_prompt=True)[:40]
    except TemplateError as exc:
        out = str(exc)
    except MemoryError:
        out = "MemoryError"
    print(json.dumps([out, time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]]), flush=True)
"""


def _render_all(cases: list[tuple[str, str]]) -> list[tuple[str, float, int]]:
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(cases), capture_output=True, text=True, cwd=REPO, timeout=300)
    results = [tuple(json.loads(line)) for line in proc.stdout.splitlines()]
    assert len(results) == len(cases), proc.stderr[-2000:]
    return results  # type: ignore[return-value]


@pytest.mark.slow
def test_hostile_templates_fail_fast_in_little_memory() -> None:
    """The memory limit's case renders in a child of its own: the limit reads the
    process's resident growth, and memory an earlier case freed, still resident,
    is reused without growing it (a run read a 107 MiB peak behind the 64 MiB
    limit after the other cases)."""
    cases = [(source, content) for source, (_, content) in CASES.items()]
    results = _render_all(cases[:-1]) + _render_all(cases[-1:])
    assert CASES[cases[-1][0]][0] == "MiB of memory"
    for (source, (needle, content)), (message, seconds, peak) in zip(CASES.items(), results):
        assert needle in message and message.startswith("t failed: "), (source, message)
        assert seconds < 2, (source, seconds)
        # the message itself (5 MB, 20 MB as UCS-4 copies) is the caller's; the template's own use stays small
        assert peak < 100 * 2**20 + 8 * len(content), (source, peak / 2**20)


def test_ordinary_templates_still_render() -> None:
    """The checks refuse only growth: filters, formatting and concatenation of normal size work."""
    from localllm.engine.chat_template import ChatTemplate

    source = ("{% for m in messages %}{{ '<|%s|>' % m.role }}{{ m.content | trim | replace('\\n', ' ') }}"
              "{{ '[{}]'.format(loop.index) }}{{ ['a', 'b'] | join(',') ~ '!' }}{{ m | tojson(indent=2) | length > 0 }}"
              "{{ (m.content | list | length) }}{{ m.content.split() | map('upper') | list | join(' ') }}{% endfor %}")
    out = ChatTemplate(source, "t").render([{"role": "user", "content": " hello\nthere "}], bos_token="", eos_token="", add_generation_prompt=True)
    assert out == "<|user|>hello there[1]a,b!True13HELLO THERE"
