"""Claude Code, Codex and opencode, their own CLIs, against ``localllm serve``
started with no options (issue 59, items 1, 3 and 6).

What a client can be asked here is bounded by the models that ship: Gemma 3
270M is a base model (it does not end a turn), and SmolLM2 is trained on 8,192
tokens, fewer than Claude Code's first prompt (about 11,500 of Gemma's). So:

- opencode on SmolLM2 runs to its end: exit 0 and the model's reply printed;
- Claude Code on Gemma 3 and Codex on SmolLM2: every request the client sends
  is answered 200 in its own protocol (before: Claude Code's every prompt was a
  400, Codex's a context error), and where the client ends in an error it is
  the model's length (the reply reached the output limit), not the server.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.clients.conftest import answered, client_bin, client_env
from tests.helpers.server import KEY


def _ok(server, path: str, run: subprocess.CompletedProcess | None = None) -> list[str]:
    """The router's lines for ``path``: at least one; each a 200, or a 499 where the
    client hung up on a side request when it was done (opencode leaves its title
    request so); the request with the longest prompt, the agent's own, a 200."""
    lines = answered(server, path)
    assert lines, "\n".join(server.lines[-20:]) + ("\n" + (run.stdout + run.stderr)[-3000:] if run else "")
    assert all(f"{path} 200 " in ln or f"{path} 499 " in ln for ln in lines), "\n".join(lines)
    assert f"{path} 200 " in max(lines, key=lambda ln: int(ln.split("prompt=")[1].split()[0])), "\n".join(lines)
    return lines


@pytest.mark.slow
@pytest.mark.agents
def test_claude_code_is_answered_on_every_request(router, tmp_path: Path) -> None:
    env = client_env(tmp_path / "home", ANTHROPIC_BASE_URL=router.base, ANTHROPIC_API_KEY=KEY, ANTHROPIC_MODEL="gemma3-270m",
                     CLAUDE_CODE_MAX_OUTPUT_TOKENS="16")
    r = subprocess.run([str(client_bin("claude")), "-p", "Say hello", "--output-format", "json"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=900)
    result = json.loads(r.stdout.strip().splitlines()[-1])
    lines = _ok(router, "/v1/messages", r)
    prompt = max(int(ln.split("prompt=")[1].split()[0]) for ln in lines)
    assert prompt > 6000  # Claude Code's prompt, taken with no --ctx
    assert result["api_error_status"] is None, result
    # the model's own length: Gemma 3 270M is a base model and writes on to the 16 tokens asked
    assert result["is_error"] is False or "output token maximum" in result["result"], result


@pytest.mark.slow
@pytest.mark.agents
def test_codex_is_answered_in_the_responses_api(router, tmp_path: Path) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text(f'model = "smollm2"\nmodel_provider = "localllm"\n[model_providers.localllm]\nname = "localllm"\n'
                                      f'base_url = "{router.base}/v1"\nwire_api = "responses"\nenv_key = "LOCALLLM_KEY"\n')
    env = client_env(tmp_path / "home", CODEX_HOME=str(home), LOCALLLM_KEY=KEY)
    r = subprocess.run([str(client_bin("codex")), "exec", "--skip-git-repo-check", "Say hello"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    lines = _ok(router, "/v1/responses", r)
    assert int(lines[0].split("prompt=")[1].split()[0]) > 6000  # Codex's first prompt, taken with no --ctx
    out = r.stdout + r.stderr
    assert r.returncode == 0 or "reason: max_output_tokens" in out, out[-2000:]


@pytest.mark.slow
@pytest.mark.agents
def test_opencode_runs_to_its_end(router, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    config = project / "opencode.json"
    config.write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"localllm": {"npm": "@ai-sdk/openai-compatible", "name": "localllm",
                                  "options": {"baseURL": f"{router.base}/v1", "apiKey": KEY}, "models": {"smollm2": {"name": "smollm2"}}}},
        "model": "localllm/smollm2"}))
    r = subprocess.run([str(client_bin("opencode")), "run", "-m", "localllm/smollm2", "Say hello"],
                       env=client_env(tmp_path / "home", OPENCODE_CONFIG=str(config)), cwd=project,
                       capture_output=True, text=True, timeout=900)
    lines = _ok(router, "/v1/chat/completions", r)
    assert max(int(ln.split("prompt=")[1].split()[0]) for ln in lines) > 6000  # opencode's agent prompt, with no --ctx
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert r.stdout.strip(), r.stderr[-2000:]
