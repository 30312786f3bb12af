"""Chat templates run with limits: a hostile template is one line naming whose fault it is."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from localllm.commands.advice import cli_message
from scripts.fuzz_gguf import STR, _replace_kv, enc
from tests.helpers.cli import cli, one_line
from tests.helpers.damaged_gguf import mutated


@pytest.mark.slow
def test_template_limits_in_the_renderer() -> None:
    from localllm.engine.chat_template import ChatTemplate, TemplateError

    msgs = [{"role": "user", "content": "hi"}]
    ok = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}", "t")
    assert ok.render(msgs, bos_token="", eos_token="", add_generation_prompt=True) == "<user>hi<a>"
    cases = {
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}": "ran for more than",
        "{{ 'x' * 10 ** 100 }}": "too large",
        "{{ 'x' * 10 ** 10 }}": "characters",
        "{{ 'x' * 100000000 }}": "characters",
        "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}": "characters",
        "{{ 'x'|center(1000000000) }}": "past the output limit",
        "{{ raise_exception('no system role') }}": "no system role",
        "{% for %}": "TemplateSyntaxError",
        "{{ ''.__class__.__mro__ }}": "",
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}": "RecursionError",
    }
    for source, needle in cases.items():
        t0 = time.perf_counter()
        with pytest.raises(TemplateError) as info:
            ChatTemplate(source, "the test template", seconds=1.0).render(msgs, bos_token="", eos_token="", add_generation_prompt=True)
        # the library names its own settings; the CLI words the same error with its flags
        assert needle in str(info.value) and "use chat=False or use_template(FILE|NAME)" in str(info.value), (source, str(info.value))
        assert "use --raw or --template FILE|NAME" in cli_message(info.value)
        assert time.perf_counter() - t0 < 10, source


@pytest.mark.slow
def test_model_template_that_loops_is_the_models_fault(synth_model: Path, tmp_path: Path) -> None:
    """Rendered without limits, this header's template ran for hours."""
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    f = mutated(synth_model, tmp_path, "loop.gguf", lambda m: _replace_kv(m, "tokenizer.chat_template", STR, enc(STR, loop), add=True))
    one_line(cli("run", str(f), "-p", "hi", "-n", "2", timeout=120), 1, str(f), "the model's chat template failed", "use --raw or --template")
    assert cli("run", str(f), "-p", "hi", "-n", "2", "--raw", timeout=120).returncode == 0


@pytest.mark.slow
def test_template_option(synth_model: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.jinja"
    good.write_text("{% for m in messages %}{{ m.content }} {% endfor %}")
    proc = cli("run", str(synth_model), "-p", "the cat", "-n", "2", "--temp", "0", "--template", str(good), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompt_tokens"] >= 2
    proc = cli("run", str(synth_model), "-p", "the cat", "-n", "2", "--template", "chatml", "--json")
    assert proc.returncode == 0, proc.stderr
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ 'x' * 10 ** 12 }}")
    one_line(cli("run", str(synth_model), "-p", "hi", "--template", str(bad)), 1, "bad.jinja failed", "use --raw or --template")
    one_line(cli("run", str(synth_model), "-p", "hi", "--template", "no-such-template"), 2, "not a built-in template", "chatml")
    one_line(cli("run", str(synth_model), "-p", "hi", "--raw", "--template", "chatml"), 2, "--raw uses no chat template")


@pytest.mark.parametrize("name", ["meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja"])
def test_llama_3_templates_get_todays_date_as_llama_cpp_gives_it(name: str) -> None:
    """Issue 45 item 8: Llama 3.1/3.3 templates read ``date_string`` (llama.cpp sets it
    and ``datetime`` in common/chat.cpp's common_chat_extra_context), 3.2 calls
    ``strftime_now``; without them a template wrote its fallback, 26 Jul 2024, as today."""
    from localllm.engine.chat_template import ChatTemplate

    source = (Path(__file__).parents[1] / "serve" / "templates" / name).read_text(encoding="utf-8")
    before = time.strftime("%d %b %Y")
    text = ChatTemplate(source, name).render([{"role": "user", "content": "hi"}], bos_token="<s>", eos_token="</s>", add_generation_prompt=True)
    after = time.strftime("%d %b %Y")
    assert f"Today Date: {before}\n" in text or f"Today Date: {after}\n" in text, text[:200]
    assert "26 Jul 2024" not in text


def test_what_llama_cpps_jinja_runs_renders_here_too() -> None:
    """Kimi K2's list.append/pop, DeepSeek R1's ``tojson`` of a ``map``, text + none or an
    undefined value (Command R+, FireFunction): rendered as llama.cpp's own Jinja engine
    renders them (common/jinja), never changing the caller's messages, and bounded."""
    from localllm.engine.chat_template import ChatTemplate, TemplateError

    msgs = [{"role": "user", "content": "hi", "tool_calls": []}]
    kw = {"bos_token": "", "eos_token": "", "add_generation_prompt": False}
    queue = "{% set q = namespace(ids=[]) %}{% set _ = q.ids.append('a') %}{% set _ = q.ids.append('b') %}{{ q.ids.pop(0) }}{{ q.ids }}"
    assert ChatTemplate(queue, "t").render(msgs, **kw) == "a['b']"
    # the template's own copy: the caller's lists stay as they were
    assert ChatTemplate("{% set _ = messages[0].tool_calls.append(1) %}{% set _ = messages.append(2) %}{{ messages|length }}",
                        "t").render(msgs, **kw) == "2"
    assert msgs == [{"role": "user", "content": "hi", "tool_calls": []}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert ChatTemplate("{{ tools | map(attribute='function') | tojson }}", "t").render(msgs, tools=tools, **kw) == '[{"name": "f"}]'
    assert ChatTemplate("{{ 'a' + none + 'b' + messages[0].nothing }}", "t").render(msgs, **kw) == "ab"
    # FireFunction joins the tools' JSON to its prompt (as llama.cpp's firefunction handler gave it); with none, nothing
    fire = ChatTemplate("{{ 'Available functions:\\n' + functions }}", "t")
    assert json.loads(fire.render(msgs, tools=tools, **kw).split("\n", 1)[1]) == tools
    assert fire.render(msgs, **kw) == "Available functions:\n"
    for source, needle in (("{% set q = namespace(l=range(100000)|list * 10) %}{% set _ = q.l.append(1) %}", "list.append would make"),
                           ("{{ (range(100000)|list * 2) | map('string') | tojson }}", "more than 100,000"),
                           ("{{ 1 + none }}", "TypeError"), ("{% set _ = messages[0].update({}) %}", "SecurityError")):
        with pytest.raises(TemplateError) as info:
            ChatTemplate(source, "t", seconds=5.0).render(msgs, **kw)
        assert needle in str(info.value), (source, str(info.value))
